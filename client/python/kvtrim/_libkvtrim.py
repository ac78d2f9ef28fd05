"""libkvtrim.so through ctypes: its C ABI (libkvtrim/kvtrim_c.h) declared once, the tensor
and layer structs, and the conversion of NumPy arrays / torch tensors to them (pointers and
strides; host tensors made dense when they are not). Used by kvtrim.local (the engine in
this process) and by the Client's native transport (the C++ client)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import struct
import sys
import threading
from typing import Any, List, Optional, Sequence

import grpc
import numpy as np

from .errors import KvtrimError
from .layers import Layer
from .results import (CompressResult, SessionResult, decision_of, output_bytes,
                      summary_of)
from .tensors import TensorView
from .v1 import kvtrim_pb2 as pb

ABI_VERSION = 5
ERROR_BYTES = 4096


class Tensor(ctypes.Structure):
    """kvtrim_tensor."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("device", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 3), ("strides", ctypes.c_int64 * 3)]


class LayerStruct(ctypes.Structure):
    """kvtrim_layer."""

    _fields_ = [("layer_id", ctypes.c_int32), ("softmax_scale", ctypes.c_float),
                ("keys", Tensor), ("values", Tensor), ("queries", Tensor),
                ("output", ctypes.c_void_p), ("output_capacity", ctypes.c_uint64)]


# kvtrim_layer packed field by field (layer_id, softmax_scale, then per tensor: data, dtype,
# device, shape[3], strides[3], then output, output_capacity): one pack_into per layer on the
# torch CUDA path instead of a ctypes assignment per field.
LAYER_PACKING = struct.Struct("=if" + "Qii3q3q" * 3 + "QQ")
_ABSENT_TENSOR = (0, 0, 0, 0, 0, 0, 0, 0, 0)
PACKABLE = LAYER_PACKING.size == ctypes.sizeof(LayerStruct)  # else the checked path only
_TORCH_DTYPES: dict = {}          # torch dtype -> proto DType, filled on first torch layer
_THREAD = threading.local()        # per-thread error buffer of the C calls


def error_buffer() -> ctypes.Array:
    """This thread's ERROR_BYTES buffer for the C calls' messages."""
    buffer = getattr(_THREAD, "error", None)
    if buffer is None:
        buffer = _THREAD.error = ctypes.create_string_buffer(ERROR_BYTES)
    return buffer


def default_library() -> str:
    """$KVTRIM_LIBRARY, else the repository's build tree (build/libkvtrim/libkvtrim.so)."""
    if os.environ.get("KVTRIM_LIBRARY"):
        return os.environ["KVTRIM_LIBRARY"]
    repo = pathlib.Path(__file__).resolve().parents[3]
    return str(repo / "build" / "libkvtrim" / "libkvtrim.so")


_LOADED = {}


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """libkvtrim (loaded once per path) with its functions declared; checks the ABI
    version. KvtrimError FAILED_PRECONDITION naming "library" when it cannot be loaded."""
    path = path or default_library()
    if path in _LOADED:
        return _LOADED[path]
    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"library: cannot load libkvtrim from {path}: {error} (build it with "
                          "`make -C build kvtrim_c`, or set KVTRIM_LIBRARY)", "library") from None
    p, size, i32, c_char_p = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_char_p
    compress_args = [p, c_char_p, size, ctypes.POINTER(LayerStruct), size, p, ctypes.POINTER(p),
                     ctypes.POINTER(size), c_char_p, size]
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
    lib.kvtrim_compress.argtypes = compress_args
    lib.kvtrim_compress.restype = i32
    lib.kvtrim_client_connect.argtypes = [c_char_p, ctypes.c_double, i32, c_char_p,
                                          ctypes.POINTER(p), c_char_p, size]
    lib.kvtrim_client_connect.restype = i32
    lib.kvtrim_client_free.argtypes = [p]
    lib.kvtrim_client_compress.argtypes = compress_args
    lib.kvtrim_client_compress.restype = i32
    lib.kvtrim_session_open.argtypes = [p, c_char_p, size, i32, ctypes.POINTER(i32),
                                        ctypes.POINTER(p), c_char_p, size]
    lib.kvtrim_session_open.restype = i32
    lib.kvtrim_session_send.argtypes = [p, ctypes.POINTER(LayerStruct), p, c_char_p, size]
    lib.kvtrim_session_send.restype = i32
    lib.kvtrim_session_answer.argtypes = [p, i32, ctypes.POINTER(p), ctypes.POINTER(size),
                                          c_char_p, size]
    lib.kvtrim_session_answer.restype = i32
    lib.kvtrim_session_finish.argtypes = [p, ctypes.POINTER(p), ctypes.POINTER(size),
                                          ctypes.POINTER(p), ctypes.POINTER(size), c_char_p, size]
    lib.kvtrim_session_finish.restype = i32
    lib.kvtrim_session_free.argtypes = [p]
    lib.kvtrim_buffer_free.argtypes = [p]
    version = lib.kvtrim_abi_version()
    if version != ABI_VERSION:
        raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"library: {path} has ABI version {version}, this package "
                          f"{ABI_VERSION}", "library")
    _LOADED[path] = lib
    return lib


def check(code: int, error: ctypes.Array) -> None:
    """Raises the KvtrimError of a non-zero return code."""
    if code != 0:
        raise KvtrimError.from_code_number(code, error.value.decode("utf-8", "replace"))


def tensor_struct(view: Optional[TensorView], keep: List[Any]) -> Tensor:
    """The kvtrim_tensor of a view (host tensors made dense when they are not; what must
    stay alive during the call goes to `keep`)."""
    out = Tensor()
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


def output_buffer(keys: TensorView):
    """A uint8 device buffer for one layer's kept lists (LayerInput.output): H_kv lists over
    n tokens, on the keys' device."""
    import torch

    return torch.empty(output_bytes(keys.shape[0], keys.shape[1]), dtype=torch.uint8,
                       device=keys.source.device)


def raw_function(lib: ctypes.CDLL, name: str, argtypes: list):
    """`name` of `lib` as a second function object declared with address-sized integers
    (and plain ints) only, so a hot call converts no ctypes objects; the library's own
    declaration is unchanged."""
    function = lib[name]
    function.argtypes = argtypes
    function.restype = ctypes.c_int32
    return function


class OutputPool:
    """Device output buffers of one session's layers carved from shared uint8 blocks (one
    torch allocation per SLOTS layers instead of one per layer). take() returns the
    (block, byte offset) a LayerDecision reads its lists from; a block lives as long as a
    decision still refers to it. Use from one thread."""

    SLOTS = 8

    __slots__ = ("_block", "_pointer", "_used", "_size", "_device_index")

    def __init__(self):
        self._block, self._pointer, self._used, self._size = None, 0, 0, 0
        self._device_index = -1

    def take(self, nbytes: int, device: Any, device_index: int) -> tuple:
        """((block, offset), device pointer, capacity) of `nbytes` on torch `device`
        (CUDA ordinal `device_index`), 256-byte aligned."""
        need = (nbytes + 255) // 256 * 256
        if (self._block is None or self._used + need > self._size
                or device_index != self._device_index):
            import torch

            self._size = need * self.SLOTS
            self._block = torch.empty(self._size, dtype=torch.uint8, device=device)
            self._pointer, self._used, self._device_index = self._block.data_ptr(), 0, device_index
        offset = self._used
        self._used += need
        return (self._block, offset), self._pointer + offset, nbytes


class CallScratch:
    """Reused memory of one thread's (or one session's) hot C calls: a layer struct, the
    answer's out-values and an error buffer, with their addresses, and the pool of device
    output buffers."""

    __slots__ = ("layer", "layer_address", "answer", "answer_address", "size",
                 "size_address", "error", "error_address", "outputs")

    def __init__(self):
        self.layer = LayerStruct()
        self.layer_address = ctypes.addressof(self.layer)
        self.answer = ctypes.c_void_p()
        self.answer_address = ctypes.addressof(self.answer)
        self.size = ctypes.c_size_t()
        self.size_address = ctypes.addressof(self.size)
        self.error = ctypes.create_string_buffer(ERROR_BYTES)
        self.error_address = ctypes.addressof(self.error)
        self.outputs = OutputPool()


def torch_dtypes(torch: Any) -> None:
    """Fills the torch dtype -> proto DType table on first use (torch imported by then)."""
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: pb.DTYPE_F32, torch.float16: pb.DTYPE_F16,
                              torch.bfloat16: pb.DTYPE_BF16})


def cuda_fields(tensor: Any, device_index: int) -> Optional[tuple]:
    """The kvtrim_tensor fields (data, dtype, device, shape, strides) of a rank-3 torch
    tensor of f32 / f16 / bf16 on CUDA device `device_index`; None for anything else (absent
    tensors: the absent fields), which the checked path then handles or refuses."""
    if tensor is None:
        return _ABSENT_TENSOR
    dtype = _TORCH_DTYPES.get(getattr(tensor, "dtype", None))
    if dtype is None or tensor.get_device() != device_index:
        return None
    shape = tensor.shape
    if len(shape) != 3:
        return None
    return (tensor.data_ptr(), dtype, device_index, *shape, *tensor.stride())


def pack_cuda_tensors(target: LayerStruct, keys, values, queries, layer_id: int,
                      softmax_scale: float, with_output: bool,
                      device_index: Optional[int] = None,
                      outputs: Optional[OutputPool] = None) -> Optional[tuple]:
    """Packs a layer whose present tensors are torch tensors on one CUDA device (the keys',
    or `device_index`) into `target` with one struct.pack_into: (output or None,), the
    output a buffer of its own or, from `outputs`, a (block, offset) of the pool; None when
    the tensors are anything else (then nothing was written)."""
    torch = sys.modules.get("torch")
    if not PACKABLE or torch is None or not isinstance(keys, torch.Tensor) or not keys.is_cuda:
        return None
    torch_dtypes(torch)
    index = keys.get_device() if device_index is None else device_index
    fields = (cuda_fields(keys, index), cuda_fields(values, index),
              cuda_fields(queries, index))
    if None in fields:
        return None
    output, pointer, capacity = None, 0, 0
    if with_output and outputs is not None:
        output, pointer, capacity = outputs.take(output_bytes(fields[0][3], fields[0][4]),
                                                 keys.device, index)
    elif with_output:
        output = torch.empty(output_bytes(fields[0][3], fields[0][4]), dtype=torch.uint8,
                             device=keys.device)
        pointer, capacity = output.data_ptr(), output.numel()
    LAYER_PACKING.pack_into(target, 0, int(layer_id), float(softmax_scale), *fields[0],
                            *fields[1], *fields[2], pointer, capacity)
    return (output,)


def layer_array(layers: Sequence[Layer], keep: List[Any], with_outputs: bool = False):
    """(kvtrim_layer array, torch device of the first CUDA keys or None, output buffers) of
    `layers`; `with_outputs`: a device output buffer for every CUDA layer (else None).
    Layers of torch CUDA tensors are packed in one step; others are checked and converted
    tensor by tensor (host tensors made dense)."""
    array = (LayerStruct * len(layers))()
    device = None
    outputs: List[Any] = []
    for i, layer in enumerate(layers):
        packed = pack_cuda_tensors(array[i], layer.keys, layer.values, layer.queries,
                                   layer.layer_id, layer.softmax_scale, with_outputs)
        if packed is not None:
            keep.append(layer)  # its tensors, while kvtrim may still read them
            device = device if device is not None else layer.keys.device
            outputs.append(packed[0])
            continue
        views = layer.views(f"layers[{i}]")
        array[i].layer_id = int(layer.layer_id)
        array[i].softmax_scale = float(layer.softmax_scale)
        for name in ("keys", "values", "queries"):
            setattr(array[i], name, tensor_struct(views.get(name), keep))
        if views["keys"].on_cuda and device is None:
            device = views["keys"].source.device
        buffer = output_buffer(views["keys"]) if with_outputs and views["keys"].on_cuda else None
        if buffer is not None:
            array[i].output = buffer.data_ptr()
            array[i].output_capacity = buffer.numel()
        outputs.append(buffer)
    return array, device, outputs


def stream_handle(stream: Any, device) -> Optional[int]:
    """The cudaStream_t to order reads after: `stream` (a torch.cuda.Stream or an int), else
    torch's current stream of `device`, else None (host tensors)."""
    if stream is not None:
        return stream if isinstance(stream, int) else int(stream.cuda_stream)
    if device is None:
        return None
    raw = _RAW_STREAM[0]
    if raw is None:
        import torch

        # torch's own fast accessor, else the public (slower) one.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda index: torch.cuda.current_stream(index).cuda_stream)
        _RAW_STREAM[0] = raw
    index = device.index
    return int(raw(index if index is not None else 0))


_RAW_STREAM: list = [None]  # the current-stream accessor, found on first use


def call_compress(lib: ctypes.CDLL, function: str, handle, settings: bytes,
                  layers: Sequence[Layer], stream: Any = None,
                  with_outputs: bool = False) -> CompressResult:
    """lib.kvtrim_compress or lib.kvtrim_client_compress (`function`) on `handle`: the answer
    as a CompressResult, lists on the keys' device for CUDA inputs (written by kvtrim into
    device buffers of ours when `with_outputs`: per-head answers of per-layer policies)."""
    keep: List[Any] = []
    array, device, outputs = layer_array(layers, keep, with_outputs)
    cuda_stream = stream_handle(stream, device)
    answer, size = ctypes.c_void_p(), ctypes.c_size_t()
    error = error_buffer()
    code = getattr(lib, function)(handle, settings, len(settings), array, len(layers), cuda_stream,
                    ctypes.byref(answer), ctypes.byref(size), error, ERROR_BYTES)
    check(code, error)
    try:
        response = pb.CompressResponse.FromString(ctypes.string_at(answer, size.value))
    finally:
        lib.kvtrim_buffer_free(answer)
    return CompressResult([decision_of(r, device, out) for r, out in
                           zip(response.layers, outputs)], response.backend)


class NativeClient:
    """The C++ client of kvtrimd (kvtrim_client_*): the Client's native transport."""

    def __init__(self, target: str, timeout: float, max_message_bytes: int,
                 library: Optional[str] = None, auth_token: Optional[str] = None):
        self._lib = load(library)
        handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(ERROR_BYTES)
        check(self._lib.kvtrim_client_connect(target.encode(), float(timeout),
                                              int(min(max_message_bytes, 2**31 - 1)),
                                              (auth_token or "").encode(),
                                              ctypes.byref(handle), error, ERROR_BYTES), error)
        self._handle = handle

    def compress(self, settings: bytes, layers: Sequence[Layer], stream: Any = None,
                 with_outputs: bool = False) -> CompressResult:
        """The Compress RPC through the C++ client (`with_outputs`: CUDA layers' lists
        written by kvtrimd into device buffers of ours, see call_compress)."""
        return call_compress(self._lib, "kvtrim_client_compress", self._handle, settings,
                             layers, stream, with_outputs)

    def session(self, settings: bytes, open_lease: bool, with_outputs: bool
                ) -> "NativeSession":
        """A CompressSession through the C++ client (see NativeSession)."""
        return NativeSession(self, settings, open_lease, with_outputs)

    def close(self) -> None:
        """Closes the connection and its lease."""
        if self._handle:
            self._lib.kvtrim_client_free(self._handle)
            self._handle = ctypes.c_void_p()


def _take(lib: ctypes.CDLL, pointer: ctypes.c_void_p, size: ctypes.c_size_t) -> bytes:
    """The bytes of a buffer libkvtrim returned, freed."""
    try:
        return ctypes.string_at(pointer, size.value)
    finally:
        lib.kvtrim_buffer_free(pointer)


class NativeSession:
    """A CompressSession through libkvtrim's C++ client (kvtrim_session_*), with
    kvtrim.Session's interface: send / result / finish / cancel, a context manager. Host
    tensors are framed in chunks from their own memory (one copy); CUDA tensors go as region
    slices when kvtrimd granted the lease (else as host copies), and with `with_outputs`
    their per-head lists come back through device buffers. Use from one thread."""

    def __init__(self, client: "NativeClient", settings: bytes, open_lease: bool,
                 with_outputs: bool):
        self._lib = client._lib
        handle, regions = ctypes.c_void_p(), ctypes.c_int32(0)
        error = ctypes.create_string_buffer(ERROR_BYTES)
        check(self._lib.kvtrim_session_open(client._handle, settings, len(settings),
                                            int(open_lease), ctypes.byref(regions),
                                            ctypes.byref(handle), error, ERROR_BYTES), error)
        self._handle = handle
        self.regions = bool(regions.value)
        self._with_outputs = with_outputs and self.regions
        self._alive: List[Any] = []            # tensors and buffers kvtrimd may still read
        # The packed layer of send (copied by the C side), the answer's out-values, the error
        # buffer and the pool of device output buffers.
        self._scratch = CallScratch()
        p, size = ctypes.c_void_p, ctypes.c_size_t
        self._send_call = raw_function(self._lib, "kvtrim_session_send", [p, p, p, p, size])
        self._answer_call = raw_function(self._lib, "kvtrim_session_answer",
                                         [p, ctypes.c_int32, p, p, p, size])
        self._devices: dict = {}
        self._outputs: dict = {}
        self._answers: dict = {}
        self._finished = False
        self._result: Optional[SessionResult] = None
        self._error: Optional[KvtrimError] = None

    def send(self, keys, values=None, queries=None, *, layer_id: int,
             softmax_scale: float = 0.0, stream: Any = None) -> None:
        """Sends one layer ([H_kv, n, d] keys, values, [H_q, w, d] queries)."""
        if self._finished:
            raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION, "session already finished")
        device = getattr(keys, "device", None)
        on_cuda = device is not None and getattr(device, "type", "cpu") == "cuda"
        if on_cuda and not self.regions:        # no lease: the tensors go as host copies
            keys, values, queries = (None if t is None else t.cpu()
                                     for t in (keys, values, queries))
        packed = (pack_cuda_tensors(self._scratch.layer, keys, values, queries, layer_id,
                                    softmax_scale, self._with_outputs, None,
                                    self._scratch.outputs)
                  if on_cuda and self.regions else None)
        if packed is not None:     # torch CUDA tensors: packed in one step, the struct reused
            address, keep, output = self._scratch.layer_address, (keys, values, queries), packed[0]
        else:
            keep = []
            array, _, outputs = layer_array(
                [Layer(keys, values, queries, layer_id, softmax_scale)], keep,
                self._with_outputs and on_cuda)
            address, output = ctypes.addressof(array), outputs[0]
            keep.append(array)
        scratch = self._scratch
        check(self._send_call(self._handle.value, address,
                              stream_handle(stream, device if on_cuda else None),
                              scratch.error_address, ERROR_BYTES), scratch.error)
        self._alive.append((keep, output))
        if on_cuda:
            self._devices[int(layer_id)] = device
            self._outputs[int(layer_id)] = output

    def result(self, layer_id: int, timeout: Optional[float] = None):
        """Waits for the answer of `layer_id` (per-layer policies); `timeout` is the
        session's own deadline here."""
        if layer_id in self._answers:
            return self._answers[layer_id]
        scratch = self._scratch
        check(self._answer_call(self._handle.value, int(layer_id), scratch.answer_address,
                                scratch.size_address, scratch.error_address, ERROR_BYTES),
              scratch.error)
        decision = decision_of(pb.LayerResult.FromString(_take(self._lib, scratch.answer,
                                                                scratch.size)),
                               self._devices.get(layer_id), self._outputs.get(layer_id))
        self._answers[layer_id] = decision
        return decision

    def finish(self, timeout: Optional[float] = None) -> SessionResult:
        """Sends finish; every answer and the summary (again on a second call)."""
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        if self._finished:
            raise KvtrimError(grpc.StatusCode.CANCELLED, "the session was cancelled")
        layers, layers_size = ctypes.c_void_p(), ctypes.c_size_t()
        summary, summary_size = ctypes.c_void_p(), ctypes.c_size_t()
        error = ctypes.create_string_buffer(ERROR_BYTES)
        self._finished = True
        try:
            check(self._lib.kvtrim_session_finish(
                self._handle, ctypes.byref(layers), ctypes.byref(layers_size),
                ctypes.byref(summary), ctypes.byref(summary_size), error, ERROR_BYTES), error)
            response = pb.CompressResponse.FromString(_take(self._lib, layers, layers_size))
            result = SessionResult(summary=summary_of(
                pb.SessionSummary.FromString(_take(self._lib, summary, summary_size))))
            for r in response.layers:
                result.layers[r.layer_id] = self._answers.get(r.layer_id) or decision_of(
                    r, self._devices.get(r.layer_id), self._outputs.get(r.layer_id))
            self._result = result
            return result
        except KvtrimError as error:
            self._error = error
            raise
        finally:
            self._close()

    def cancel(self) -> None:
        """Cancels the stream."""
        self._finished = True
        self._close()

    def _close(self) -> None:
        """Frees the session (cancelling it when unfinished)."""
        if self._handle:
            self._lib.kvtrim_session_free(self._handle)
            self._handle = ctypes.c_void_p()
        self._alive.clear()

    def __enter__(self) -> "NativeSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.cancel()
        elif not self._finished:
            self.finish()
