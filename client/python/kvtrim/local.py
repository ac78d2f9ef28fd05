"""In-process kvtrim: the sidecar's engine loaded into this process (libkvtrim.so, the C ABI
of libkvtrim/kvtrim_c.h), for workers that want no second process.

    engine = kvtrim.local.Engine(backend="gpu", device=0)
    result = engine.compress(keys, values, queries, policy="dropkv", keep=0.2)
    call = engine.prepare(policy="dropkv", keep=0.2)       # settings fixed once
    decision = call(keys, values, queries, layer_id=3)      # one layer's LayerDecision

`compress` has Client.compress's signature and answers; tensors (NumPy arrays, torch tensors
on the host or on the engine's CUDA device) are passed by pointer with their strides, never
copied (host tensors must be dense row-major; others are copied once). CUDA tensors are read
after the work queued on torch's current stream (or `stream=`). The library is found at
`library=`, else $KVTRIM_LIBRARY, else <repo>/build/libkvtrim/libkvtrim.so.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Sequence, Union

from . import _libkvtrim
from ._libkvtrim import default_library
from .client import as_layers
from .layers import Layer
from .models import ModelBundle, registration_messages
from .prepared import PreparedCompress
from .results import CompressResult
from .settings import build_settings, per_head_answer

__all__ = ["Engine", "PreparedCompress", "default_library"]


class Engine:
    """kvtrim's engine in this process.

    Args:
      backend: "cpu", "gpu" or "auto" (the GPU when one is visible).
      device: the CUDA ordinal the GPU backend computes on (CUDA tensors must be there).
      workers: CPU threads, or GPU worker contexts.
      numerics: "fast" or "exact", for calls that leave numerics unspecified.
      library: path of libkvtrim.so (default: $KVTRIM_LIBRARY, else the repo's build tree).
    """

    def __init__(self, backend: str = "auto", device: int = 0, *, workers: int = 1,
                 numerics: str = "fast", library: Optional[str] = None):
        self._lib = _libkvtrim.load(library)
        self.device = device
        handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(_libkvtrim.ERROR_BYTES)
        _libkvtrim.check(self._lib.kvtrim_engine_create(
            backend.encode(), device, workers, numerics.encode(), ctypes.byref(handle), error,
            _libkvtrim.ERROR_BYTES), error)
        self._handle = handle
        self._backend = self._lib.kvtrim_engine_backend(handle).decode()
        self._bundles: Dict[str, ModelBundle] = {}
        self._settings_cache: Dict[Any, bytes] = {}
        self._prepared: Dict[Any, PreparedCompress] = {}

    @property
    def backend(self) -> str:
        """"cpu" or "gpu"."""
        return self._backend

    def register_model(self, bundle: Union[str, ModelBundle]) -> str:
        """Registers a model (bundle path or ModelBundle); returns the same digest the
        sidecar gives for the same content."""
        if isinstance(bundle, str):
            bundle = ModelBundle.from_safetensors(bundle)
        messages = list(registration_messages(bundle, 64 << 20))
        pointers = (ctypes.c_void_p * len(messages))(
            *[ctypes.cast(ctypes.c_char_p(m), ctypes.c_void_p) for m in messages])
        sizes = (ctypes.c_size_t * len(messages))(*[len(m) for m in messages])
        digest = ctypes.create_string_buffer(128)
        error = ctypes.create_string_buffer(_libkvtrim.ERROR_BYTES)
        _libkvtrim.check(self._lib.kvtrim_register_model(
            self._handle, pointers, sizes, len(messages), digest, 128, error,
            _libkvtrim.ERROR_BYTES), error)
        self._bundles[digest.value.decode()] = bundle
        return digest.value.decode()

    def _settings_key(self, policy: str, settings: Dict[str, Any]):
        """A hashable key of a keyword set, or None when a value is not hashable."""
        try:
            key = (policy, tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict)
                                         else v) for k, v in settings.items())))
            hash(key)
            return key
        except TypeError:
            return None

    def _settings_bytes(self, policy: str, settings: Dict[str, Any]) -> bytes:
        """The serialized CompressionSettings, built once per distinct keyword set."""
        key = self._settings_key(policy, settings)
        cached = self._settings_cache.get(key) if key is not None else None
        if cached is None:
            cached = build_settings(policy, **settings).SerializeToString()
            if key is not None and len(self._settings_cache) < 256:
                self._settings_cache[key] = cached
        return cached

    def prepare(self, policy: str, **settings) -> PreparedCompress:
        """A call with these settings fixed (Client.compress's keywords): `call(keys, values,
        queries, *, layer_id=0, softmax_scale=0.0, stream=None)` returns that layer's
        LayerDecision. Torch CUDA layers skip every per-call settings step; other inputs
        take compress()'s path. The settings are checked on the first call."""
        settings_bytes = self._settings_bytes(policy, settings)

        def general(keys, values, queries, *, layer_id, softmax_scale, stream):
            return self._compress_layers(
                settings_bytes, as_layers(keys, values, queries, None, layer_id, softmax_scale),
                stream, settings)

        return PreparedCompress(self, policy, settings_bytes, self._with_outputs(settings),
                                general)

    def compress(self, keys=None, values=None, queries=None, *, policy: str,
                 layers: Optional[Sequence[Union[Layer, tuple]]] = None, layer_id: int = 0,
                 softmax_scale: float = 0.0, stream: Any = None, **settings) -> CompressResult:
        """As kvtrim.Client.compress, computed in this process. `stream`: a torch.cuda.Stream
        or a cudaStream_t as int (default: torch's current stream of the keys' device)."""
        if layers is None and keys is not None:
            # One layer: through the prepared call of these settings (made once per set).
            key = self._settings_key(policy, settings)
            prepared = self._prepared.get(key) if key is not None else None
            if prepared is None:
                prepared = self.prepare(policy, **settings)
                if key is not None and len(self._prepared) < 256:
                    self._prepared[key] = prepared
            decision = prepared(keys, values, queries, layer_id=layer_id,
                                softmax_scale=softmax_scale, stream=stream)
            return CompressResult([decision], self._backend)
        return self._compress_layers(
            self._settings_bytes(policy, settings),
            as_layers(keys, values, queries, layers, layer_id, softmax_scale), stream, settings)

    def _with_outputs(self, settings: Dict[str, Any]) -> bool:
        """Whether CUDA layers' lists are written straight into device buffers (per-head
        answers on the GPU backend; the engine answers model-wide policies' lists itself)."""
        return per_head_answer(settings) and self.backend == "gpu"

    def _compress_layers(self, settings_bytes: bytes, call_layers: Sequence[Layer],
                         stream: Any, settings: Dict[str, Any]) -> CompressResult:
        """kvtrim_compress of `call_layers` with serialized settings."""
        return _libkvtrim.call_compress(self._lib, "kvtrim_compress", self._handle,
                                        settings_bytes, call_layers, stream,
                                        self._with_outputs(settings))

    def close(self) -> None:
        """Frees the engine."""
        if self._handle:
            self._lib.kvtrim_engine_free(self._handle)
            self._handle = ctypes.c_void_p()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
