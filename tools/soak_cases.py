"""Deliberately bad requests of the soak test, each with the gRPC code and message fragment
docs/errors.md documents for it. A case is a function that makes the bad call; the runner
compares what it raised with the expectation (a wrong code is an unexpected error)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

import grpc
import numpy as np

import kvtrim
from kvtrim.v1 import kvtrim_pb2 as pb

import soak_raw
from soak_client import NO_CHUNK, SMALL_CHUNK, SoakClient
from soak_data import MODEL_SHAPE, WINDOW
from soak_shm import place

NO_DIGEST = "sha256:" + "0" * 64


@dataclass
class Case:
    """A bad request: its name, the transport it uses, the code and message fragment it
    must get, and the function making the call."""

    name: str
    transport: str
    code: str
    fragment: str
    run: Callable[[SoakClient], None]
    native: bool = False   # needs the native (libkvtrim) client


def _layer(sc: SoakClient, shape=(2, 8, 64), n=256, dtype="f16") -> Tuple[np.ndarray, ...]:
    """Fresh writable copies of a small layer's keys, values and queries."""
    hkv, hq, d = shape
    pool, offset = sc.ctx.pool, int(sc.rng.integers(1 << 20))
    return (pool.tensor(dtype, (hkv, n, d), offset).copy(),
            pool.tensor(dtype, (hkv, n, d), offset + 17).copy(),
            pool.tensor(dtype, (hq, WINDOW, d), offset + 31).copy())


def _poison(array: np.ndarray, value: float) -> np.ndarray:
    """`array` with one element set to `value` (NaN or Inf) at a random place."""
    array.reshape(-1)[array.size // 3] = value
    return array


def _inline(sc: SoakClient, k, v, q, policy="dropkv", **settings) -> None:
    """A unary inline Compress through grpcio."""
    settings = settings or {"keep": 0.2}
    sc.client.compress(k, v, q, policy=policy, transport="inline", **settings)


def unknown_policy(sc):
    """An unknown policy name."""
    _inline(sc, *_layer(sc), policy="soak-no-such-policy")


def nan_keys_inline(sc):
    """NaN in the keys, inline."""
    k, v, q = _layer(sc)
    _inline(sc, _poison(k, np.nan), v, q)


def nan_keys_shm(sc):
    """NaN in the keys, read from host shm (the client's slab)."""
    k, v, q = _layer(sc, dtype="f32")
    views, _, _ = place(sc.slab, {"keys": _poison(k, np.nan), "values": v, "queries": q}, 0)
    sc.client.compress(views["keys"], views["values"], views["queries"], policy="snapkv",
                       keep=0.2, transport="regions")


def inf_values_chunked_session(sc):
    """Inf in the values of a session's third layer, sent in 16 KiB chunks."""
    sc.client.chunk_bytes = SMALL_CHUNK
    with sc.client.session(policy="dropkv", keep=0.2, transport="inline") as session:
        for layer_id in range(3):
            k, v, q = _layer(sc, dtype="bf16")
            if layer_id == 2:
                _poison(v, np.inf)
            session.send(k, v, q, layer_id=layer_id)
        session.finish()


def values_shape_mismatch(sc):
    """Values with fewer tokens than the keys."""
    k, v, q = _layer(sc)
    _inline(sc, k, v[:, :100].copy(), q)


def gqa_mismatch(sc):
    """H_q = 3 with H_kv = 2."""
    k, v, q = _layer(sc)
    _inline(sc, k, v, q[:3].copy())


def keep_tokens_over_n(sc):
    """A budget of n + 1 tokens."""
    _inline(sc, *_layer(sc, n=512), keep_tokens=513)


def keep_fraction_over_one(sc):
    """keep_fraction 1.5."""
    _inline(sc, *_layer(sc), keep=1.5)


def unknown_model_digest(sc):
    """A model policy naming a digest nobody registered."""
    _inline(sc, *_layer(sc, shape=MODEL_SHAPE), policy="criticalkv", keep=0.2,
            model_digest=NO_DIGEST)


def model_policy_without_digest(sc):
    """A model policy without a model_digest."""
    _inline(sc, *_layer(sc, shape=MODEL_SHAPE), policy="criticalkv", keep=0.2)


def model_shape_mismatch(sc):
    """A model policy on a layer that does not fit the registered model."""
    _inline(sc, *_layer(sc), policy="criticalkv", keep=0.2, model_digest=sc.ctx.digest)


def unknown_parameter(sc):
    """A parameter the policy does not take."""
    _inline(sc, *_layer(sc), policy="snapkv", keep=0.2, params={"soak_bogus": 1})


def too_few_window_rows(sc):
    """8 query rows for SnapKV's window of 32."""
    k, v, q = _layer(sc)
    _inline(sc, k, v, q[:, :8].copy(), policy="snapkv", keep=0.2)


def session_duplicate_layer(sc):
    """The same layer_id twice in one session."""
    sc.client.chunk_bytes = NO_CHUNK
    with sc.client.session(policy="keydiff", keep=0.3, transport="inline") as session:
        k, v, q = _layer(sc)
        session.send(k, v, q, layer_id=0)
        session.send(k, v, q, layer_id=0)
        session.finish()


def cancelled_session(sc):
    """The client cancels a session after two layers (finish then reports CANCELLED)."""
    sc.client.chunk_bytes = SMALL_CHUNK
    session = sc.client.session(policy="snapkv", keep=0.2, transport="inline")
    for layer_id in range(2):
        session.send(*_layer(sc, n=1024), layer_id=layer_id)
    session.cancel()
    session.finish(timeout=sc.ctx.timeout)


def native_nan_session(sc):
    """NaN in a layer of a session through the C++ client."""
    session = sc.native.session(policy="dropkv", keep=0.2, transport="inline")
    try:
        k, v, q = _layer(sc)
        session.send(k, v, q, layer_id=0)
        session.send(_poison(k, np.nan), v, q, layer_id=1)
        session.finish()
    except BaseException:
        session.cancel()
        raise


def _raw_shm(sc, region_id: str, offset: int = 0, metadata: bool = True) -> None:
    """A hand-built Compress whose keys are a host_shm slice of `region_id`."""
    k, _, _ = _layer(sc)
    _, offsets, _ = place(sc.raw.buffer, {"keys": k}, 0)
    layer = soak_raw.layer_input(0, "f16", {"keys": k.shape}, {"keys": offsets["keys"] + offset},
                                 region_id)
    request = pb.CompressRequest(settings=kvtrim.build_settings("knorm", keep=0.2),
                                 layers=[layer])
    meta = [(soak_raw.CLIENT_ID, sc.lease.client_id)] if metadata else []
    sc.ctx.raw_call(request, timeout=sc.ctx.timeout, metadata=meta)


def unknown_region(sc):
    """A host_shm tensor in a region id never registered."""
    _raw_shm(sc, "shm-soak-never-registered")


def region_overrun(sc):
    """A host_shm tensor reaching past its region's end."""
    _raw_shm(sc, sc.raw.region_id, offset=sc.raw.size)


def region_without_client_id(sc):
    """A host_shm tensor on a call without kvtrim-client-id metadata."""
    _raw_shm(sc, sc.raw.region_id, metadata=False)


def foreign_region(sc):
    """A host_shm tensor in a region of another client's lease."""
    _raw_shm(sc, sc.ctx.foreign_region)


def missing_shm_segment(sc):
    """Registering a shm segment that does not exist."""
    sc.lease.register_host_shm(f"/kvtrim-soak-missing-{int(sc.rng.integers(1 << 30))}", 4096)


def _raw_inline(sc, tensor: pb.Tensor, layers: int = 1) -> None:
    """A hand-built Compress (no metadata) whose keys are `tensor`."""
    request = pb.CompressRequest(settings=kvtrim.build_settings("knorm", keep=0.2))
    for layer_id in range(layers):
        request.layers.append(pb.LayerInput(layer_id=layer_id, keys=tensor))
    sc.ctx.raw_call(request, timeout=sc.ctx.timeout)


def layers_empty(sc):
    """A Compress without layers."""
    _raw_inline(sc, pb.Tensor(), layers=0)


def dtype_unspecified(sc):
    """A tensor without a dtype."""
    _raw_inline(sc, pb.Tensor(shape=[1, 4, 4], inline_data=bytes(64)))


def short_inline_bytes(sc):
    """Inline bytes shorter than shape x dtype size."""
    _raw_inline(sc, pb.Tensor(dtype=pb.DTYPE_F32, shape=[2, 64, 8], inline_data=bytes(100)))


def chunked_in_unary(sc):
    """A chunked tensor in a unary Compress."""
    tensor = pb.Tensor(dtype=pb.DTYPE_F32, shape=[1, 4, 4])
    tensor.chunked.total_bytes = 64
    _raw_inline(sc, tensor)


CASES: List[Case] = [
    Case("unknown_policy", "unary_inline", "INVALID_ARGUMENT", "unknown policy", unknown_policy),
    Case("nan_keys_inline", "unary_inline", "INVALID_ARGUMENT", "contains NaN", nan_keys_inline),
    Case("nan_keys_shm", "unary_shm", "INVALID_ARGUMENT", "contains NaN", nan_keys_shm),
    Case("inf_values_chunked_session", "session_chunked", "INVALID_ARGUMENT", "contains Inf",
         inf_values_chunked_session),
    Case("values_shape_mismatch", "unary_inline", "INVALID_ARGUMENT", "does not match keys",
         values_shape_mismatch),
    Case("gqa_mismatch", "unary_inline", "INVALID_ARGUMENT", "is not a positive multiple",
         gqa_mismatch),
    Case("keep_tokens_over_n", "unary_inline", "INVALID_ARGUMENT", "exceeds n=",
         keep_tokens_over_n),
    Case("keep_fraction_over_one", "unary_inline", "INVALID_ARGUMENT", "must be in (0, 1]",
         keep_fraction_over_one),
    Case("unknown_model_digest", "unary_inline", "FAILED_PRECONDITION", "unknown model digest",
         unknown_model_digest),
    Case("model_policy_without_digest", "unary_inline", "FAILED_PRECONDITION",
         "needs a registered model", model_policy_without_digest),
    Case("model_shape_mismatch", "unary_inline", "INVALID_ARGUMENT",
         "does not match the registered model", model_shape_mismatch),
    Case("unknown_parameter", "unary_inline", "INVALID_ARGUMENT", "unknown parameter",
         unknown_parameter),
    Case("too_few_window_rows", "unary_inline", "INVALID_ARGUMENT", "query rows",
         too_few_window_rows),
    Case("session_duplicate_layer", "session_inline", "INVALID_ARGUMENT", "duplicate layer_id",
         session_duplicate_layer),
    Case("cancelled_session", "session_chunked", "CANCELLED", "", cancelled_session),
    Case("native_nan_session", "native_session", "INVALID_ARGUMENT", "contains NaN",
         native_nan_session, native=True),
    Case("unknown_region", "raw_shm", "NOT_FOUND", "no region", unknown_region),
    Case("region_overrun", "raw_shm", "INVALID_ARGUMENT", "reaches past", region_overrun),
    Case("region_without_client_id", "raw_shm", "FAILED_PRECONDITION", "kvtrim-client-id",
         region_without_client_id),
    Case("foreign_region", "raw_shm", "PERMISSION_DENIED", "belongs to another client",
         foreign_region),
    Case("missing_shm_segment", "regions_lease", "NOT_FOUND", "cannot open shared-memory",
         missing_shm_segment),
    Case("layers_empty", "raw_inline", "INVALID_ARGUMENT", "layers: empty", layers_empty),
    Case("dtype_unspecified", "raw_inline", "INVALID_ARGUMENT", "DTYPE_UNSPECIFIED",
         dtype_unspecified),
    Case("short_inline_bytes", "raw_inline", "INVALID_ARGUMENT", "bytes, but shape",
         short_inline_bytes),
    Case("chunked_in_unary", "raw_inline", "INVALID_ARGUMENT",
         "chunked tensors are sent in a CompressSession", chunked_in_unary),
]


def outcome(case: Case, sc: SoakClient) -> Tuple[str, str]:
    """(code name, message) the case's call ended with ("OK" when it did not fail)."""
    try:
        case.run(sc)
    except kvtrim.KvtrimError as error:
        return error.code.name, error.message
    except grpc.RpcError as error:
        return error.code().name, error.details() or ""
    except Exception as error:  # anything else is a wrong outcome too
        return type(error).__name__, str(error)
    return "OK", "the bad request was answered"
