"""In-process kvtrim: the sidecar's engine loaded into this process (libkvtrim.so, the C ABI
of service/inprocess/kvtrim_c.h), for workers that want no second process.

    engine = kvtrim.local.Engine(backend="gpu", device=0)
    result = engine.compress(keys, values, queries, policy="dropkv", keep=0.2)

`compress` has Client.compress's signature and answers; tensors (NumPy arrays, torch tensors
on the host or on the engine's CUDA device) are passed by pointer with their strides, never
copied (host tensors must be dense row-major; others are copied once). CUDA tensors are read
after the work queued on torch's current stream (or `stream=`). The library is found at
`library=`, else $KVTRIM_LIBRARY, else <repo>/build/service/libkvtrim.so.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from typing import Any, Dict, List, Optional, Sequence, Union

import grpc
import numpy as np

from .client import as_layers
from .errors import KvtrimError
from .layers import Layer
from .models import ModelBundle, registration_messages
from .results import CompressResult, decision_of
from .settings import build_settings
from .tensors import TensorView
from .v1 import kvtrim_pb2 as pb

ABI_VERSION = 1
_ERROR_BYTES = 4096


class _Tensor(ctypes.Structure):
    """kvtrim_tensor."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("device", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 3), ("strides", ctypes.c_int64 * 3)]


class _Layer(ctypes.Structure):
    """kvtrim_layer."""

    _fields_ = [("layer_id", ctypes.c_int32), ("softmax_scale", ctypes.c_float),
                ("keys", _Tensor), ("values", _Tensor), ("queries", _Tensor)]


def default_library() -> str:
    """$KVTRIM_LIBRARY, else the repository's build tree (build/service/libkvtrim.so)."""
    if os.environ.get("KVTRIM_LIBRARY"):
        return os.environ["KVTRIM_LIBRARY"]
    repo = pathlib.Path(__file__).resolve().parents[3]
    return str(repo / "build" / "service" / "libkvtrim.so")


def _load(path: str) -> ctypes.CDLL:
    """libkvtrim with its functions' signatures declared; checks the ABI version."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"library: cannot load libkvtrim from {path}: {error} (build it with "
                          "`make -C build kvtrim_c`, or set KVTRIM_LIBRARY)", "library") from None
    p, size, i32, c_char_p = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_char_p
    lib.kvtrim_abi_version.restype = i32
    lib.kvtrim_engine_create.argtypes = [c_char_p, i32, i32, c_char_p, ctypes.POINTER(p),
                                         c_char_p, size]
    lib.kvtrim_engine_create.restype = i32
    lib.kvtrim_engine_free.argtypes = [p]
    lib.kvtrim_engine_backend.argtypes = [p]
    lib.kvtrim_engine_backend.restype = c_char_p
    lib.kvtrim_register_model.argtypes = [p, ctypes.POINTER(p), ctypes.POINTER(size), size,
                                          c_char_p, size, c_char_p, size]
    lib.kvtrim_register_model.restype = i32
    lib.kvtrim_compress.argtypes = [p, c_char_p, size, ctypes.POINTER(_Layer), size, p,
                                    ctypes.POINTER(p), ctypes.POINTER(size), c_char_p, size]
    lib.kvtrim_compress.restype = i32
    lib.kvtrim_buffer_free.argtypes = [p]
    version = lib.kvtrim_abi_version()
    if version != ABI_VERSION:
        raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"library: {path} has ABI version {version}, this package "
                          f"{ABI_VERSION}", "library")
    return lib


def _check(code: int, error: ctypes.Array) -> None:
    """Raises the KvtrimError of a non-zero return code."""
    if code != 0:
        raise KvtrimError.from_code_number(code, error.value.decode("utf-8", "replace"))


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
        self._lib = _load(library or default_library())
        self.device = device
        handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.kvtrim_engine_create(backend.encode(), device, workers,
                                              numerics.encode(), ctypes.byref(handle), error,
                                              _ERROR_BYTES), error)
        self._handle = handle
        self._bundles: Dict[str, ModelBundle] = {}

    @property
    def backend(self) -> str:
        """"cpu" or "gpu"."""
        return self._lib.kvtrim_engine_backend(self._handle).decode()

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
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.kvtrim_register_model(self._handle, pointers, sizes, len(messages),
                                               digest, 128, error, _ERROR_BYTES), error)
        self._bundles[digest.value.decode()] = bundle
        return digest.value.decode()

    def _tensor(self, view: Optional[TensorView], keep: List[Any]) -> _Tensor:
        """The kvtrim_tensor of a view (host tensors made dense when they are not)."""
        out = _Tensor()
        if view is None:
            return out
        out.dtype = view.dtype
        out.shape[:] = list(view.shape)
        if view.on_cuda:
            out.data = view.source.data_ptr()
            out.device = view.source.device.index or 0
            out.strides[:] = list(view.strides)
            return out
        out.device = -1
        if view.is_dense():
            source = view.source
            out.data = (source.data_ptr() if hasattr(source, "data_ptr")
                        else source.__array_interface__["data"][0])
            keep.append(source)
        else:
            dense = np.frombuffer(view.host_bytes(), dtype=np.uint8)
            keep.append(dense)
            out.data = dense.__array_interface__["data"][0]
        return out

    def compress(self, keys=None, values=None, queries=None, *, policy: str,
                 layers: Optional[Sequence[Union[Layer, tuple]]] = None, layer_id: int = 0,
                 softmax_scale: float = 0.0, stream: Any = None, **settings) -> CompressResult:
        """As kvtrim.Client.compress, computed in this process. `stream`: a torch.cuda.Stream
        or a cudaStream_t as int (default: torch's current stream of the keys' device)."""
        call_layers = as_layers(keys, values, queries, layers, layer_id, softmax_scale)
        request_settings = build_settings(policy, **settings).SerializeToString()
        keep: List[Any] = []
        array = (_Layer * len(call_layers))()
        device = None
        for i, layer in enumerate(call_layers):
            views = layer.views(f"layers[{i}]")
            array[i].layer_id = int(layer.layer_id)
            array[i].softmax_scale = float(layer.softmax_scale)
            for name in ("keys", "values", "queries"):
                setattr(array[i], name, self._tensor(views.get(name), keep))
            if views["keys"].on_cuda and device is None:
                device = views["keys"].source.device
        handle = self._stream_handle(stream, device)
        answer, size = ctypes.c_void_p(), ctypes.c_size_t()
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        code = self._lib.kvtrim_compress(self._handle, request_settings, len(request_settings),
                                         array, len(call_layers), handle, ctypes.byref(answer),
                                         ctypes.byref(size), error, _ERROR_BYTES)
        _check(code, error)
        try:
            response = pb.CompressResponse.FromString(ctypes.string_at(answer, size.value))
        finally:
            self._lib.kvtrim_buffer_free(answer)
        return CompressResult([decision_of(r, device) for r in response.layers],
                              response.backend)

    @staticmethod
    def _stream_handle(stream: Any, device) -> Optional[int]:
        """The cudaStream_t to order reads after (None = the legacy default stream)."""
        if stream is not None:
            return stream if isinstance(stream, int) else int(stream.cuda_stream)
        if device is None:
            return None
        import torch

        return int(torch.cuda.current_stream(device).cuda_stream)

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


__all__ = ["Engine", "default_library"]
