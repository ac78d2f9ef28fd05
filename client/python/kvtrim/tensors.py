"""Tensors as kvtrim sends them: NumPy arrays or torch tensors, f32 / f16 / bf16, rank 3.

NumPy is always available; torch is imported only when a torch tensor is given (its module
is never imported by this file). bfloat16 NumPy arrays are ml_dtypes.bfloat16 arrays.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from .errors import invalid_argument
from .v1 import kvtrim_pb2 as pb

# Proto dtype of each element type name (NumPy dtype.name / torch dtype string).
_DTYPES = {
    "float32": pb.DTYPE_F32,
    "float16": pb.DTYPE_F16,
    "bfloat16": pb.DTYPE_BF16,
}
_ITEMSIZE = {pb.DTYPE_F32: 4, pb.DTYPE_F16: 2, pb.DTYPE_BF16: 2}


def is_torch(x: Any) -> bool:
    """True when `x` is a torch.Tensor (without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def dtype_name(x: Any) -> str:
    """"float32" / "float16" / "bfloat16" (or another name) of a NumPy array or torch tensor."""
    if is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return np.asarray(x).dtype.name if not isinstance(x, np.ndarray) else x.dtype.name


def proto_dtype(x: Any, field: str) -> int:
    """The proto DType of `x`; INVALID_ARGUMENT naming `field`.dtype for any other type."""
    name = dtype_name(x)
    if name not in _DTYPES:
        raise invalid_argument(f"{field}.dtype",
                               f"expected float32, float16 or bfloat16, got {name}")
    return _DTYPES[name]


def itemsize(dtype: int) -> int:
    """Bytes per element of a proto DType."""
    return _ITEMSIZE[dtype]


@dataclass
class TensorView:
    """A rank-3 tensor described for the wire.

    Attributes:
      source: the caller's array or tensor (kept alive while the call runs).
      dtype: proto DType.
      shape: (A, N, C), e.g. [H_kv, n, d] for keys.
      strides: element strides (s0, s1, s2) of `source`.
      on_cuda: a torch tensor on a CUDA device.
    """

    source: Any
    dtype: int
    shape: Tuple[int, int, int]
    strides: Tuple[int, int, int]
    on_cuda: bool

    @property
    def nbytes(self) -> int:
        """Dense byte size: product(shape) * sizeof(dtype)."""
        a, n, c = self.shape
        return a * n * c * itemsize(self.dtype)

    def is_dense(self) -> bool:
        """Row-major contiguous (strides (N*C, C, 1))."""
        a, n, c = self.shape
        return self.strides == (n * c, c, 1) or self.nbytes == 0

    def host_bytes(self) -> memoryview:
        """The dense row-major bytes on the host: a view when `source` already is dense host
        memory, else one copy (a transposed, strided or device tensor)."""
        if is_torch(self.source):
            import torch  # only reached with a torch tensor

            t = self.source.detach()
            if t.device.type != "cpu":
                t = t.to("cpu")
            t = t.contiguous()
            as_int = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
            array = as_int.numpy()
        else:
            array = np.ascontiguousarray(self.source)
        # As unsigned bytes: the buffer protocol has no format for float16 / bfloat16.
        return memoryview(array.view(np.uint8).reshape(-1))


def view_of(x: Any, field: str) -> TensorView:
    """The TensorView of a rank-3 NumPy array or torch tensor; INVALID_ARGUMENT naming `field`
    (".shape" for another rank, ".dtype" for another element type)."""
    if x is None:
        raise invalid_argument(field, "required")
    if is_torch(x):
        dtype = proto_dtype(x, field)
        if x.dim() != 3:
            raise invalid_argument(f"{field}.shape", f"expected rank 3, got {list(x.shape)}")
        return TensorView(x, dtype, tuple(int(s) for s in x.shape),
                          tuple(int(s) for s in x.stride()), x.device.type == "cuda")
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    dtype = proto_dtype(x, field)
    if x.ndim != 3:
        raise invalid_argument(f"{field}.shape", f"expected rank 3, got {list(x.shape)}")
    size = x.dtype.itemsize
    if any(s % size for s in x.strides) or any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)
    return TensorView(x, dtype, tuple(int(s) for s in x.shape),
                      tuple(int(s) // size for s in x.strides), False)


def optional_view(x: Any, field: str) -> Optional[TensorView]:
    """view_of(x, field), or None when `x` is None."""
    return None if x is None else view_of(x, field)
