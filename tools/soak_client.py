"""One concurrent client of the soak test: its connections (kvtrim.Client on grpcio, the
native C++ client through libkvtrim, a Regions lease) and one method per transport, each
sending a Plan and checking every answered layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

import kvtrim
from kvtrim.v1 import kvtrim_pb2 as pb

import soak_raw
from soak_data import DataPool, Plan, PolicyInfo, check_budget, check_decision, check_lists
from soak_shm import RawSegment, aligned, place

SLAB_BYTES = 12 << 20            # the client's shared_array: layers sent over host_shm
RAW_BYTES = SLAB_BYTES + (1 << 20)  # its own segment: raw requests and their output regions
SMALL_CHUNK = 16 << 10           # session_chunked: every layer's tensors in 16 KiB chunks
NO_CHUNK = 1 << 30               # session_inline: one message per layer
# One TCP connection per client (grpc otherwise shares one per target within a process).
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Context:
    """What every client of a worker process shares."""

    target: str
    library: Optional[str]
    digest: str
    catalog: Dict[str, PolicyInfo]
    mix: Dict[str, List[str]]
    transports: List[str]
    pool: DataPool
    timeout: float
    raw_call: Any                    # Compress on a process-wide channel (soak_raw)
    foreign_region: Optional[str]    # a region of a lease no client holds


class SoakClient:
    """A client: connections, segments, and the transports. Use from one thread."""

    def __init__(self, ctx: Context, rng: np.random.Generator):
        """Connects at once (open); `rng` drives the client's random choices."""
        self.ctx = ctx
        self.rng = rng
        self.client = self.native = self.raw = self.slab = None
        self.open()

    def open(self) -> None:
        """Connects (grpcio client with its lease and shared slab, native client, own
        registered segment)."""
        ctx = self.ctx
        self.client = kvtrim.Client(ctx.target, native=False, timeout=ctx.timeout,
                                    session_timeout=ctx.timeout, channel_options=CHANNEL_OPTIONS)
        self.lease = self.client.lease()
        self.slab = self.client.shared_array((SLAB_BYTES,), np.uint8)
        self.raw = RawSegment(self.lease, RAW_BYTES)
        if ctx.library:
            self.native = kvtrim.Client(ctx.target, native=True, library=ctx.library,
                                        timeout=ctx.timeout, session_timeout=ctx.timeout)

    def close(self) -> None:
        """Closes the connections (kvtrimd releases the lease's regions), then unlinks the
        segments."""
        self.slab = None
        for client in (self.native, self.client):
            if client is not None:
                try:
                    client.close()
                except Exception:  # a broken connection: nothing left to release here
                    pass
        if self.raw is not None:
            self.raw.close()
        self.client = self.native = self.raw = None

    # --- helpers --------------------------------------------------------------------------

    def layers(self, plan: Plan, slab: bool = False) -> List[kvtrim.Layer]:
        """The plan's layers from the data pool, copied into the shared slab when `slab`."""
        out, start = [], 0
        for layer_id in plan.layer_ids:
            arrays = self.ctx.pool.layer(plan, layer_id)
            if slab:
                arrays, _, start = place(self.slab, arrays, start)
            out.append(kvtrim.Layer(arrays["keys"], arrays.get("values"),
                                    arrays.get("queries"), layer_id=layer_id))
        return out

    def check(self, plan: Plan, decisions: Dict[int, Any]) -> Optional[str]:
        """The first problem with a plan's answers, or None."""
        if sorted(decisions) != sorted(plan.layer_ids):
            return f"answered layers {sorted(decisions)}, sent {plan.layer_ids}"
        info = self.ctx.catalog[plan.policy]
        for layer_id, decision in decisions.items():
            problem = check_decision(decision, plan, info)
            if problem:
                return f"layer {layer_id}: {problem}"
        return None

    # --- transports -----------------------------------------------------------------------

    def run(self, plan: Plan) -> Optional[str]:
        """Sends `plan` on its transport; returns a problem with the answers or None.
        KvtrimError / grpc.RpcError propagate."""
        return getattr(self, plan.transport)(plan)

    def unary_inline(self, plan: Plan) -> Optional[str]:
        """Compress with inline bytes (grpcio)."""
        result = self.client.compress(policy=plan.policy, layers=self.layers(plan),
                                      transport="inline", **plan.settings)
        return self.check(plan, dict(zip(plan.layer_ids, result.layers)))

    def unary_shm(self, plan: Plan) -> Optional[str]:
        """Compress over host_shm: layers in the client's shared slab (read in place) or,
        half the time, staged by the client into its staging segment."""
        in_slab = self.rng.random() < 0.5
        result = self.client.compress(policy=plan.policy, layers=self.layers(plan, in_slab),
                                      transport="regions", **plan.settings)
        return self.check(plan, dict(zip(plan.layer_ids, result.layers)))

    def native_unary(self, plan: Plan) -> Optional[str]:
        """Compress through libkvtrim's C++ client (kvtrim_client_compress)."""
        result = self.native.compress(policy=plan.policy, layers=self.layers(plan),
                                      **plan.settings)
        return self.check(plan, dict(zip(plan.layer_ids, result.layers)))

    def _session(self, session, plan: Plan, layers: List[kvtrim.Layer]) -> Optional[str]:
        """Sends the layers on `session` (waiting for each answer when plan.serial and the
        policy answers per layer), finishes and checks."""
        try:
            for layer in layers:
                session.send(layer.keys, layer.values, layer.queries, layer_id=layer.layer_id)
                if plan.serial and plan.family != "wide":
                    session.result(layer.layer_id, timeout=self.ctx.timeout)
            result = session.finish(timeout=self.ctx.timeout)
        except BaseException:
            session.cancel()
            raise
        return self.check(plan, result.layers)

    def _grpcio_session(self, plan: Plan, chunk_bytes: int, regions: bool) -> Optional[str]:
        """A grpcio CompressSession: inline messages, chunks or host_shm slices."""
        self.client.chunk_bytes = chunk_bytes
        session = self.client.session(policy=plan.policy,
                                      transport="regions" if regions else "inline",
                                      **plan.settings)
        return self._session(session, plan, self.layers(plan, slab=regions))

    def session_inline(self, plan: Plan) -> Optional[str]:
        """CompressSession, each layer one inline message (grpcio)."""
        return self._grpcio_session(plan, NO_CHUNK, False)

    def session_chunked(self, plan: Plan) -> Optional[str]:
        """CompressSession, tensors as tensor_chunk messages of 16 KiB (grpcio)."""
        return self._grpcio_session(plan, SMALL_CHUNK, False)

    def session_shm(self, plan: Plan) -> Optional[str]:
        """CompressSession, layers as host_shm slices of the shared slab (grpcio)."""
        return self._grpcio_session(plan, NO_CHUNK, True)

    def native_session(self, plan: Plan) -> Optional[str]:
        """CompressSession through libkvtrim's C++ client (chunks framed from the arrays'
        memory); half the sessions also open a Regions lease ("auto")."""
        transport = "auto" if self.rng.random() < 0.5 else "inline"
        session = self.native.session(policy=plan.policy, transport=transport,
                                      **plan.settings)
        return self._session(session, plan, self.layers(plan))

    def unary_shm_output(self, plan: Plan) -> Optional[str]:
        """Compress by hand over host_shm with an output region: kvtrimd pwrites each
        layer's kept lists into the client's own segment; they are read back and checked."""
        shape = plan.settings.get("output_shape")
        lists = soak_raw.output_lists(plan.shape[0], shape)
        layers, outputs, start = [], {}, 0
        for layer_id in plan.layer_ids:
            arrays = self.ctx.pool.layer(plan, layer_id)
            shapes = {name: a.shape for name, a in arrays.items()}
            _, offsets, start = place(self.raw.buffer, arrays, start)
            outputs[layer_id] = start
            start = aligned(start + soak_raw.output_bytes(lists, plan.n))
            if start > self.raw.size:
                raise ValueError("the raw segment cannot hold the plan")
            layers.append(soak_raw.layer_input(layer_id, plan.dtype, shapes, offsets,
                                               self.raw.region_id, outputs[layer_id]))
        request = pb.CompressRequest(settings=kvtrim.build_settings(plan.policy, **plan.settings),
                                     layers=layers)
        response = self.ctx.raw_call(request, timeout=self.ctx.timeout,
                                     metadata=[(soak_raw.CLIENT_ID, self.lease.client_id)])
        return self.check_outputs(plan, response, outputs, lists)

    def check_outputs(self, plan: Plan, response: pb.CompressResponse,
                      outputs: Dict[int, int], lists: int) -> Optional[str]:
        """The first problem with answers whose lists went to output regions, or None."""
        info = self.ctx.catalog[plan.policy]
        shape = plan.settings.get("output_shape", "per_head")
        answered = [r.layer_id for r in response.layers]
        if answered != plan.layer_ids:
            return f"answered layers {answered}, sent {plan.layer_ids}"
        for result in response.layers:
            if not result.output_written or result.packed.indices or result.indices:
                return f"layer {result.layer_id}: lists not (only) in the output region"
            counts = [h.kept for h in result.heads]
            try:
                kept = soak_raw.read_output(self.raw.buffer, outputs[result.layer_id], lists)
            except ValueError as error:
                return f"layer {result.layer_id}: {error}"
            problem = (check_lists(kept, counts, plan.n, lists == len(counts))
                       or check_budget(counts, plan, info, shape))
            if problem:
                return f"layer {result.layer_id}: {problem}"
        return None
