"""The synchronous kvtrim client: every RPC of kvtrim.v1.Kvtrim, with transports chosen per
call (inline bytes, chunked sessions, shared memory, CUDA IPC) and models re-registered
when a server has lost them."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import grpc

from . import _wire
from .auth import BearerTokenInterceptor, aio_interceptors, check_token
from .errors import KvtrimError, invalid_argument
from .layers import EncodedLayer, Layer, encode_chunked, encode_inline, encode_regions
from .models import ModelBundle, registration_messages
from .regions import RegionLease
from .results import CompressResult, decision_of
from .session import Session
from .settings import build_settings
from .shm import SharedArrays, region_slice
from .tensors import TensorView
from .v1 import kvtrim_pb2 as pb

HEALTH_SERVICE = "kvtrim.v1.Kvtrim"
_HEALTH_STATES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
CLIENT_ID_HEADER = "kvtrim-client-id"
TRANSPORTS = ("auto", "inline", "regions")


@dataclass
class TlsConfig:
    """TLS for the channel: PEM bytes of the CA that signed kvtrimd's certificate (None = the
    system roots) and, for mutual TLS, the client's own certificate chain and key."""

    root_certificates: Optional[bytes] = None
    certificate_chain: Optional[bytes] = None
    private_key: Optional[bytes] = None
    # The name kvtrimd's certificate must carry when it differs from the target's host
    # (grpc.ssl_target_name_override); None: the target's host.
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The grpc channel credentials."""
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key,
                                            self.certificate_chain)


def is_local_target(target: str) -> bool:
    """Whether `target` is on this node (a unix socket or a loopback address)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    host = target.split("://")[-1].lstrip("/")           # dns:///localhost:50051
    for scheme in ("ipv4:", "ipv6:"):
        if host.startswith(scheme):
            host = host[len(scheme):]
    if host.startswith("["):                                # [::1]:50051
        host = host[1:host.find("]")]
    elif host.count(":") == 1:                              # 127.0.0.1:50051
        host = host.split(":")[0]
    return host in ("localhost", "::1") or host.startswith("127.")


def make_channel(target: str, tls, max_message_bytes: int, options: Sequence[Tuple[str, Any]],
                 aio: bool = False, auth_token: Optional[str] = None):
    """A grpc channel (grpc.aio when `aio`) with kvtrim's message limits, sending
    `authorization: Bearer <auth_token>` with every call when a token is given."""
    opts = [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes), *options]
    extra = {"interceptors": aio_interceptors(auth_token)} if aio and auth_token else {}
    if tls is None or tls is False:
        channel = (grpc.aio.insecure_channel(target, options=opts, **extra) if aio
                   else grpc.insecure_channel(target, options=opts))
    else:
        if tls is True:
            creds = grpc.ssl_channel_credentials()
        elif isinstance(tls, TlsConfig):
            creds = tls.credentials()
            if tls.server_name:
                opts.append(("grpc.ssl_target_name_override", tls.server_name))
        else:
            creds = tls  # grpc.ChannelCredentials
        channel = (grpc.aio.secure_channel(target, creds, options=opts, **extra) if aio
                   else grpc.secure_channel(target, creds, options=opts))
    if auth_token and not aio:
        channel = grpc.intercept_channel(channel, BearerTokenInterceptor(auth_token))
    return channel


def load_balancing_options(policy: Optional[str]) -> List[Tuple[str, Any]]:
    """Channel options choosing gRPC's load-balancing `policy` over the target's addresses:
    "round_robin" (every replica behind a headless Service) or "pick_first" (gRPC's
    default, one connection); None leaves gRPC's default."""
    if policy is None:
        return []
    if policy not in ("round_robin", "pick_first"):
        raise invalid_argument("load_balancing",
                               f"expected 'round_robin' or 'pick_first', got {policy!r:.64}")
    return [("grpc.service_config", json.dumps({"loadBalancingConfig": [{policy: {}}]}))]


def health_request(service: str) -> bytes:
    """grpc.health.v1.HealthCheckRequest{service} on the wire."""
    data = service.encode()
    return _wire.key(1, 2) + _wire.varint(len(data)) + data


def health_state(response: bytes) -> str:
    """The status name of a grpc.health.v1.HealthCheckResponse."""
    if len(response) >= 2 and response[0] == 0x08:
        return _HEALTH_STATES.get(response[1], str(response[1]))
    return "UNKNOWN"


def as_layers(keys, values, queries, layers, layer_id: int, softmax_scale: float) -> List[Layer]:
    """The call's layers: `layers` (Layer objects or (keys, values, queries) tuples, numbered
    in order) or one layer from keys / values / queries."""
    if layers is None:
        if keys is None:
            raise invalid_argument("layers", "give keys (and values, queries) or layers")
        return [Layer(keys, values, queries, layer_id, softmax_scale)]
    if keys is not None:
        raise invalid_argument("layers", "give either keys or layers, not both")
    out = []
    for i, layer in enumerate(layers):
        out.append(layer if isinstance(layer, Layer) else Layer(*layer, layer_id=i))
    if not out:
        raise invalid_argument("layers", "empty")
    return out


def _device_of(layers: Sequence[Layer]):
    """The torch device of the first CUDA keys tensor, else None (answers stay NumPy)."""
    for layer in layers:
        device = getattr(layer.keys, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            return device
    return None


class Client:
    """A connection to kvtrimd.

    Args:
      target: "host:port" or "unix:/path".
      client_id: send this `kvtrim-client-id` (a lease held elsewhere); default: the client's
        own lease's id when it uses regions.
      tls: None (plaintext), True (system roots), a TlsConfig or grpc.ChannelCredentials.
      auth_token: the bearer token kvtrimd's --auth_tokens_file lists for this tenant, sent
        with every call (`authorization: Bearer <token>`); None: no token.
      timeout: deadline of unary calls in seconds (sessions: session_timeout).
      transport: "auto" (regions for CUDA tensors and for large host tensors when the
        target is on this node and kvtrimd allows them, else inline), "inline" or "regions".
      max_message_bytes: the channel's message cap; larger inline requests go over a
        session in chunks of chunk_bytes.
      native: libkvtrim's C++ client (kvtrim_client_*, kvtrim_session_*) instead of grpcio:
        "auto" (default), when libkvtrim loads and the target is on this node, for compress()
        calls whose tensors are all CUDA tensors and for sessions that name no registered
        model (the C++ stack's round trip is about a quarter of a millisecond shorter than
        grpcio's, and it frames host tensors with one copy); True for every compress() call
        and session; False never. A client with `tls` uses grpcio only.
      library: libkvtrim.so for the native transport (default: $KVTRIM_LIBRARY, else the
        repository's build tree).
      device_outputs: kvtrimd writes CUDA layers' per-head kept lists straight into device
        buffers of this client (LayerInput.output; default); False: the lists come back in
        the answer and are copied to the device when first read.
      load_balancing: "round_robin" spreads the grpcio calls over every address the target
        resolves to (e.g. "dns:///kvtrim-headless.kvtrim.svc:50051", the remote shape's
        replicas); None keeps gRPC's default (pick_first, one connection). A model
        registered through one replica reaches the others through a shared --data_dir
        volume (kvtrimd loads it on first use) or the client's re-registration.
    """

    def __init__(self, target: str, *, client_id: Optional[str] = None, tls=None,
                 auth_token: Optional[str] = None, timeout: float = 30.0,
                 session_timeout: float = 600.0,
                 transport: str = "auto", max_message_bytes: int = 64 << 20,
                 chunk_bytes: int = 4 << 20, region_min_bytes: int = 1 << 20,
                 native: Union[bool, str] = "auto", library: Optional[str] = None,
                 device_outputs: bool = True,
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 load_balancing: Optional[str] = None):
        if transport not in TRANSPORTS:
            raise invalid_argument("transport", f"expected one of {TRANSPORTS}, got {transport!r}")
        self.target = target
        self.timeout = timeout
        self.session_timeout = session_timeout
        self.transport = transport
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = chunk_bytes
        self.region_min_bytes = region_min_bytes
        self._client_id = client_id
        self._local = is_local_target(target)
        self._auth_token = check_token(auth_token)
        self._channel = make_channel(
            target, tls, max_message_bytes,
            [*channel_options, *load_balancing_options(load_balancing)],
            auth_token=self._auth_token)
        self._bundles: Dict[str, ModelBundle] = {}
        self._lease: Optional[RegionLease] = None
        self._lease_error: Optional[KvtrimError] = None
        self._shared: Optional[SharedArrays] = None
        self._cuda = None
        self._lock = threading.Lock()
        self._methods: Dict[str, Any] = {}
        if native not in (True, False, "auto"):
            raise invalid_argument("native", f"expected True, False or 'auto', got {native!r}")
        if tls not in (None, False):
            # libkvtrim's C++ client connects in plaintext: a TLS client stays on grpcio.
            if native is True:
                raise invalid_argument("native", "the native transport has no TLS; use "
                                       "native=False (or 'auto') with tls")
            native = False
        self.native = native
        self._library = library
        self.device_outputs = bool(device_outputs)
        self._native_client = None
        self._scopes: Optional[Dict[str, int]] = None

    # --- plumbing -------------------------------------------------------------------------

    def _unary(self, method: str, request: bytes, deserializer, metadata=(),
               timeout: Optional[float] = None):
        """One unary call on raw request bytes; KvtrimError on failure."""
        call = self._methods.get(method)
        if call is None:  # one multicallable per method, made once
            call = self._channel.unary_unary(method, request_serializer=None,
                                             response_deserializer=deserializer)
            self._methods[method] = call
        try:
            return call(request, timeout=timeout or self.timeout, metadata=list(metadata))
        except grpc.RpcError as error:
            raise KvtrimError.from_rpc_error(error) from None

    def _metadata(self, uses_regions: bool) -> List[Tuple[str, str]]:
        """kvtrim-client-id when set or when the call uses this client's regions."""
        if self._client_id:
            return [(CLIENT_ID_HEADER, self._client_id)]
        if uses_regions and self._lease is not None:
            return [(CLIENT_ID_HEADER, self._lease.client_id)]
        return []

    # --- simple RPCs ----------------------------------------------------------------------

    def health(self, service: str = HEALTH_SERVICE) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", ..."""
        response = self._unary("/grpc.health.v1.Health/Check", health_request(service), None)
        return health_state(response)

    def list_policies(self) -> pb.ListPoliciesResponse:
        """Every policy served, with inputs, parameters, shapes and numerics modes."""
        return self._unary("/kvtrim.v1.Kvtrim/ListPolicies",
                           pb.ListPoliciesRequest().SerializeToString(),
                           pb.ListPoliciesResponse.FromString)

    def list_models(self) -> pb.ListModelsResponse:
        """The registered models, in digest order."""
        return self._unary("/kvtrim.v1.Kvtrim/ListModels",
                           pb.ListModelsRequest().SerializeToString(),
                           pb.ListModelsResponse.FromString)

    def list_regions(self) -> pb.ListRegionsResponse:
        """The zero-copy state (regions on or off, every client's leases and regions by kind)
        and this client's lease's regions (its own lease, or the client_id it was given);
        KvtrimError NOT_FOUND when that lease is no longer open."""
        return self._unary("/kvtrim.v1.Kvtrim/ListRegions",
                           pb.ListRegionsRequest().SerializeToString(),
                           pb.ListRegionsResponse.FromString, metadata=self._metadata(True))

    def delete_model(self, digest: str) -> None:
        """Deletes a registered model (NOT_FOUND naming `digest` when not held)."""
        self._unary("/kvtrim.v1.Kvtrim/DeleteModel",
                    pb.DeleteModelRequest(digest=digest).SerializeToString(),
                    pb.DeleteModelResponse.FromString)
        self._bundles.pop(digest, None)

    def register_model(self, bundle: Union[str, ModelBundle]) -> str:
        """Registers a model (a bundle .safetensors path or a ModelBundle) and returns its
        digest. The client remembers it and registers it again when a server answers
        FAILED_PRECONDITION for its digest (a restarted or other replica)."""
        if isinstance(bundle, str):
            bundle = ModelBundle.from_safetensors(bundle)
        call = self._channel.stream_unary("/kvtrim.v1.Kvtrim/RegisterModel",
                                          request_serializer=None,
                                          response_deserializer=pb.RegisterModelResponse.FromString)
        try:
            response = call(registration_messages(bundle, self.chunk_bytes),
                            timeout=self.session_timeout)
        except grpc.RpcError as error:
            raise KvtrimError.from_rpc_error(error) from None
        self._bundles[response.digest] = bundle
        return response.digest

    def _reregister(self, digest: str) -> bool:
        """Registers the remembered bundle of `digest` again; False when none is held."""
        bundle = self._bundles.get(digest)
        if bundle is None:
            return False
        return self.register_model(bundle) == digest

    # --- regions --------------------------------------------------------------------------

    def lease(self) -> RegionLease:
        """The client's Regions lease, opened on first use (KvtrimError FAILED_PRECONDITION
        when kvtrimd runs without --allow_client_shm)."""
        with self._lock:
            if self._lease is None or self._lease.closed:
                self._lease = RegionLease(self._channel)
                self._shared = SharedArrays(self._lease)
                self._cuda = None
            return self._lease

    def shared_array(self, shape: Sequence[int], dtype) -> Any:
        """A NumPy array in a shared-memory segment registered on the lease: tensors written
        there go to kvtrimd with no copy at all (host_shm, read in place)."""
        self.lease()
        return self._shared.empty(shape, dtype)

    def _regions_usable(self) -> bool:
        """Whether the lease can be opened (remembers a refusal)."""
        if self._lease_error is not None:
            return False
        try:
            self.lease()
            return True
        except KvtrimError as error:
            if error.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED,
                              grpc.StatusCode.PERMISSION_DENIED):
                self._lease_error = error
                return False
            raise

    def _choose(self, layers: Sequence[Layer], transport: Optional[str]) -> str:
        """"inline" or "regions" for this call."""
        transport = transport or self.transport
        if transport not in TRANSPORTS:
            raise invalid_argument("transport", f"expected one of {TRANSPORTS}, got {transport!r}")
        if transport != "auto":
            return transport
        views = [v for i, layer in enumerate(layers) for v in layer.views(f"layers[{i}]").values()]
        wants = any(v.on_cuda for v in views) or (
            self._shared is not None and any(self._shared.find(v) for v in views)) or (
            self._local and sum(v.nbytes for v in views) >= self.region_min_bytes)
        return "regions" if wants and self._local and self._regions_usable() else "inline"

    def _stage_host_views(self, all_views: Sequence[Dict[str, TensorView]]) -> Dict[int, Any]:
        """Stages (copies) every host view of `all_views` that is not already in a shared
        segment into the staging segment, in one call: {id(view): (region id, offset)}. One
        call for the whole request, because each stage() call rewrites the segment from its
        start. Call with the shared lock held until the answer has arrived."""
        staged = [v for views in all_views for v in views.values()
                  if not v.on_cuda and self._shared.find(v) is None]
        return dict(zip(map(id, staged), self._shared.stage(staged))) if staged else {}

    def _encode_regions(self, layer: Layer, views: Dict[str, TensorView], placed: Dict[int, Any],
                        output=None) -> EncodedLayer:
        """A layer as region slices: CUDA tensors by CUDA IPC, host arrays in a shared
        segment in place, other host arrays at the staging places `placed`
        (_stage_host_views of the same `views` objects). `output`: a uint8 device buffer
        kvtrim writes the kept lists into."""
        ready = None
        if any(v.on_cuda for v in views.values()):
            if self._cuda is None:
                from .cuda_ipc import CudaRegions

                self._cuda = CudaRegions(self._lease)
            device = next(v for v in views.values() if v.on_cuda).source.device.index or 0
            ready = self._cuda.record_ready(device)

        def slice_for(name: str, view: TensorView):
            if view.on_cuda:
                return "cuda_ipc", self._cuda.slice_of(view)
            found = self._shared.find(view)
            if found is not None:
                return "host_shm", region_slice(found[0], found[1], view.strides)
            region_id, offset = placed[id(view)]
            return "host_shm", region_slice(region_id, offset)

        output_slice = None
        if output is not None:
            output_slice = self._cuda.slice_at(output.data_ptr(), output.device.index or 0)
        return encode_regions(layer, views, slice_for, ready, output_slice)

    # --- compression ----------------------------------------------------------------------

    def compress(self, keys=None, values=None, queries=None, *, policy: str,
                 layers: Optional[Sequence[Union[Layer, tuple]]] = None, layer_id: int = 0,
                 softmax_scale: float = 0.0, transport: Optional[str] = None,
                 timeout: Optional[float] = None, **settings) -> CompressResult:
        """Compresses one layer (keys [H_kv, n, d], values [H_kv, n, d], queries [H_q, w, d])
        or several (`layers`) and returns the kept indices per KV head and their statistics.

        Settings are build_settings' keywords: keep=, keep_tokens= or max_perturbation=
        (with max_keep=), params=, sink_tokens=,
        recent_tokens=, output_shape=, num_layers=, model_digest=, numerics=, perturbation=,
        seed=, block_size=, request_id=, profile=, packed=. Answers are NumPy int64 arrays,
        or torch tensors on the keys' device for CUDA inputs. KvtrimError on failure (its
        `field` names the offending request field).
        """
        call_layers = as_layers(keys, values, queries, layers, layer_id, softmax_scale)
        request_settings = build_settings(policy, **settings)
        try:
            return self._compress_once(call_layers, request_settings, transport, timeout)
        except KvtrimError as error:
            if (error.code == grpc.StatusCode.FAILED_PRECONDITION and "digest" in error.message
                    and self._reregister(request_settings.model_digest)):
                return self._compress_once(call_layers, request_settings, transport, timeout)
            raise

    def _native_for(self, layers: Sequence[Layer], transport: Optional[str]):
        """The native (C++) client for this call, or None for the grpcio paths."""
        if self.native is False or (self.native == "auto" and (
                not self._local or (transport or self.transport) == "inline" or
                not all(v.on_cuda for i, layer in enumerate(layers)
                        for v in layer.views(f"layers[{i}]").values()))):
            return None
        return self._ensure_native()

    def _ensure_native(self):
        """The native client, connected on first use; None (and native off from then on)
        when libkvtrim cannot be loaded and native is "auto"."""
        if self._native_client is None:
            from ._libkvtrim import NativeClient

            try:
                self._native_client = NativeClient(self.target, self.timeout,
                                                   self.max_message_bytes, self._library,
                                                   self._auth_token)
            except KvtrimError:
                if self.native is True:
                    raise
                self.native = False  # no libkvtrim here: grpcio from now on
                return None
        return self._native_client

    def _compress_once(self, layers: List[Layer], settings: pb.CompressionSettings,
                       transport: Optional[str], timeout: Optional[float]) -> CompressResult:
        """One attempt of compress on the chosen transport."""
        native = self._native_for(layers, transport)
        if native is not None:
            try:
                return native.compress(settings.SerializeToString(), layers,
                                       with_outputs=self._outputs_allowed(settings))
            except KvtrimError as error:
                if self.native is True or error.field != "regions":
                    raise
                self.native = False  # kvtrimd refuses regions: the grpcio paths decide
        device = _device_of(layers)
        if self._choose(layers, transport) == "regions":
            self.lease()
            outputs = self._output_buffers(layers, settings)
            with self._shared.lock:
                all_views = [layer.views(f"layers[{i}]") for i, layer in enumerate(layers)]
                placed = self._stage_host_views(all_views)
                encoded = [self._encode_regions(layer, views, placed, out)
                           for layer, views, out in zip(layers, all_views, outputs)]
                return self._unary_compress(settings, encoded, True, device, timeout, outputs)
        views = [layer.views(f"layers[{i}]") for i, layer in enumerate(layers)]
        total = sum(v.nbytes for layer_views in views for v in layer_views.values())
        if total + (1 << 20) > self.max_message_bytes:
            return self._compress_chunked(layers, settings, timeout)
        encoded = [encode_inline(layer, v) for layer, v in zip(layers, views)]
        return self._unary_compress(settings, encoded, False, device, timeout)

    def _unary_compress(self, settings, encoded: List[EncodedLayer], uses_regions: bool, device,
                        timeout, outputs: Optional[List[Any]] = None) -> CompressResult:
        """The Compress RPC on encoded layers (`outputs`: each layer's output buffer)."""
        request = _wire.compress_request(settings, [e.parts for e in encoded])
        response = self._unary("/kvtrim.v1.Kvtrim/Compress", request,
                               pb.CompressResponse.FromString, self._metadata(uses_regions),
                               timeout)
        outputs = outputs or [None] * len(response.layers)
        return CompressResult([decision_of(r, device, out)
                               for r, out in zip(response.layers, outputs)], response.backend)

    def _model_wide(self, policy: str) -> bool:
        """Whether `policy` decides over every layer (ListPolicies' scope, fetched once)."""
        if self._scopes is None:
            self._scopes = {p.name: p.scope for p in self.list_policies().policies}
        return self._scopes.get(policy) == pb.DECISION_SCOPE_MODEL

    def _outputs_allowed(self, settings: pb.CompressionSettings) -> bool:
        """Whether kvtrimd may write this call's kept lists into our device buffers: per-head
        answers (offsets follow from the counts) of per-layer policies, unless the client was
        made with device_outputs=False."""
        return (self.device_outputs
                and settings.output_shape in (pb.OUTPUT_SHAPE_UNSPECIFIED, pb.PER_HEAD,
                                              pb.EQUAL_COUNT)
                and not self._model_wide(settings.policy.name))

    def _output_buffers(self, layers: Sequence[Layer], settings: pb.CompressionSettings
                        ) -> List[Any]:
        """A device output buffer per CUDA layer when the answer may go there, else None."""
        on_cuda = [_device_of([layer]) is not None for layer in layers]
        if not any(on_cuda) or not self._outputs_allowed(settings):
            return [None] * len(layers)
        from ._libkvtrim import output_buffer

        return [output_buffer(layer.views(f"layers[{i}]")["keys"]) if cuda else None
                for i, (layer, cuda) in enumerate(zip(layers, on_cuda))]

    def _compress_chunked(self, layers: List[Layer], settings, timeout) -> CompressResult:
        """Layers too large for one message: a session with chunked tensors, answered in the
        request's layer order."""
        session = Session(self._channel, settings, metadata=self._metadata(False),
                          timeout=timeout or self.session_timeout,
                          encode=lambda layer: encode_chunked(layer, layer.views("layer"),
                                                              self.chunk_bytes))
        try:
            for layer in layers:
                session.send(layer.keys, layer.values, layer.queries, layer_id=layer.layer_id,
                             softmax_scale=layer.softmax_scale)
            result = session.finish()
        except BaseException:
            session.cancel()
            raise
        # The session moved CUDA inputs' lists to their device already.
        decisions = [result.layers[layer.layer_id] for layer in layers]
        return CompressResult(decisions, result.summary.backend)

    def session(self, *, policy: str, transport: Optional[str] = None,
                timeout: Optional[float] = None, **settings):
        """A CompressSession for a whole prefill (a Session, or through the native transport a
        NativeSession with the same interface): `send` each layer as it is produced,
        `result(layer_id)` for per-layer answers, `finish()` for all of them and the
        summary. Model-wide policies (laprox, lukv, ...) answer at finish. Settings as
        compress. Inline tensors above chunk_bytes go in chunks; with transport "regions" (or
        "auto" on this node when kvtrimd allows regions) CUDA tensors and shared_array()
        arrays go as region slices, other host arrays inline."""
        request_settings = build_settings(policy, **settings)
        mode = transport or self.transport
        if mode not in TRANSPORTS:
            raise invalid_argument("transport", f"expected one of {TRANSPORTS}, got {mode!r}")
        # The native session (C++ client): on this node unless a registered model is named
        # (the grpcio session replays a stream after re-registering it), or always with
        # native=True. It frames host tensors from their own memory (one copy).
        if self.native is True or (self.native == "auto" and self._local and
                                   not request_settings.model_digest):
            native = self._ensure_native()
            if native is not None:
                return native.session(request_settings.SerializeToString(),
                                      open_lease=mode != "inline",
                                      with_outputs=self._outputs_allowed(request_settings))
        use_regions = mode == "regions" or (mode == "auto" and self._local and
                                            self._regions_usable())
        if use_regions:
            self.lease()

        def encode(layer: Layer) -> EncodedLayer:
            views = layer.views("layer")
            # Region slices for CUDA tensors and arrays already in a shared segment; a layer
            # that would need staging goes inline (the staging segment is rewritten by every
            # staged call, and a session's layers are in flight together).
            if use_regions and all(v.on_cuda or self._shared.find(v) for v in views.values()):
                return self._encode_regions(layer, views, {})
            if sum(v.nbytes for v in views.values()) > self.chunk_bytes:
                return encode_chunked(layer, views, self.chunk_bytes)
            return encode_inline(layer, views)

        return Session(self._channel, request_settings, encode=encode,
                       metadata=self._metadata(use_regions),
                       timeout=timeout or self.session_timeout, reregister=self._reregister)

    def close(self) -> None:
        """Ends the lease (kvtrimd releases the regions), unlinks segments, closes the
        channel (and the native client's)."""
        if self._native_client is not None:
            self._native_client.close()
        if self._lease is not None:
            self._lease.close()
        if self._shared is not None:
            self._shared.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
