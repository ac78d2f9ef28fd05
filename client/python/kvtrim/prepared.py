"""A prepared in-process call: kvtrim.local.Engine.prepare(policy, **settings) fixes the
settings once, so each layer costs only its tensors' pointers, a slice of a pooled output
buffer and the C call (the hot loop of a worker compressing every layer of every prefill).

    call = engine.prepare(policy="dropkv", keep=0.2)
    for i, (k, v, q) in enumerate(layers):
        decision = call(k, v, q, layer_id=i)           # a LayerDecision

Torch CUDA tensors on the engine's device are packed straight into a reused kvtrim_layer
struct; anything else goes through Engine.compress with the same settings (same answers).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

from . import _libkvtrim
from .results import CompressResult, LayerDecision
from .v1 import kvtrim_pb2 as pb


class PreparedCompress:
    """Engine.compress for one layer with settings fixed at Engine.prepare; callable as
    `call(keys, values=None, queries=None, *, layer_id=0, softmax_scale=0.0, stream=None)`
    and returning that layer's LayerDecision. Safe to call from several threads (each has
    its own scratch); the engine must outlive it."""

    def __init__(self, engine: Any, policy: str, settings_bytes: bytes, with_outputs: bool,
                 fallback: Callable[..., CompressResult]):
        self._engine = engine
        self._lib = engine._lib
        p, size = ctypes.c_void_p, ctypes.c_size_t
        self._function = _libkvtrim.raw_function(self._lib, "kvtrim_compress",
                                                 [p, p, size, p, size, p, p, p, p, size])
        self._settings = ctypes.create_string_buffer(settings_bytes, len(settings_bytes))
        self._settings_address = ctypes.addressof(self._settings)
        self._settings_size = len(settings_bytes)
        self._with_outputs = with_outputs
        self._fallback = fallback
        self._device_index = engine.device
        self._local = threading.local()
        self.policy = policy

    def __call__(self, keys, values=None, queries=None, *, layer_id: int = 0,
                 softmax_scale: float = 0.0, stream: Any = None) -> LayerDecision:
        """The decision of one layer ([H_kv, n, d] keys and values, [H_q, w, d] queries)."""
        scratch = self._scratch()
        packed = _libkvtrim.pack_cuda_tensors(scratch.layer, keys, values, queries, layer_id,
                                              softmax_scale, self._with_outputs,
                                              self._device_index, scratch.outputs)
        if packed is None:
            return self._fallback(keys, values, queries, layer_id=layer_id,
                                  softmax_scale=softmax_scale, stream=stream).layers[0]
        device, output = keys.device, packed[0]
        cuda_stream = _libkvtrim.stream_handle(stream, device)
        code = self._function(self._engine._handle.value, self._settings_address,
                              self._settings_size, scratch.layer_address, 1, cuda_stream,
                              scratch.answer_address, scratch.size_address,
                              scratch.error_address, _libkvtrim.ERROR_BYTES)
        _libkvtrim.check(code, scratch.error)
        answer = scratch.answer
        try:
            response = pb.CompressResponse.FromString(ctypes.string_at(answer, scratch.size.value))
        finally:
            self._lib.kvtrim_buffer_free(answer)
        # `keys` .. `queries` were read on the stream before the call returned its answer.
        return LayerDecision(response.layers[0], device, output)

    def _scratch(self) -> _libkvtrim.CallScratch:
        """This thread's scratch."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _libkvtrim.CallScratch()
        return scratch
