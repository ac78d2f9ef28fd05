"""One layer's tensors and their encoding for each transport (inline bytes, chunked bytes,
shared-memory or CUDA IPC region slices)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _wire
from .tensors import TensorView, optional_view, view_of
from .v1 import kvtrim_pb2 as pb


@dataclass
class Layer:
    """The tensors of one attention layer (NumPy arrays or torch tensors, f32/f16/bf16).

    Attributes:
      keys: [H_kv, n, d] post-RoPE keys (any strides; region transports read them in place).
      values: [H_kv, n, d], same dtype (value-aware policies).
      queries: [H_q, w, d] the last w prompt positions' post-RoPE queries (attention-based
        policies).
      layer_id: 0-based layer index, unique within a call or session.
      softmax_scale: logit scale; 0 = 1/sqrt(d).
    """

    keys: Any
    values: Any = None
    queries: Any = None
    layer_id: int = 0
    softmax_scale: float = 0.0

    def views(self, field_prefix: str) -> Dict[str, TensorView]:
        """The layer's present tensors as TensorViews, checked for rank and dtype."""
        out = {"keys": view_of(self.keys, f"{field_prefix}.keys")}
        for name in ("values", "queries"):
            view = optional_view(getattr(self, name), f"{field_prefix}.{name}")
            if view is not None:
                out[name] = view
        return out


@dataclass
class EncodedLayer:
    """A layer ready to send: its LayerInput parts, and for chunked tensors the
    SessionRequest parts of their chunks (sessions only)."""

    parts: List[_wire.Part]
    chunks: List[List[_wire.Part]] = field(default_factory=list)
    nbytes: int = 0


def _base(layer: Layer) -> pb.LayerInput:
    """The LayerInput fields that are not tensors."""
    return pb.LayerInput(layer_id=int(layer.layer_id), softmax_scale=float(layer.softmax_scale))


def encode_inline(layer: Layer, views: Dict[str, TensorView]) -> EncodedLayer:
    """Every tensor as inline row-major bytes (one copy, at send time)."""
    inline = {name: (v.dtype, v.shape, v.host_bytes()) for name, v in views.items()}
    parts = _wire.layer_input(_base(layer), inline)
    return EncodedLayer(parts, nbytes=sum(v.nbytes for v in views.values()))


def encode_chunked(layer: Layer, views: Dict[str, TensorView], chunk_bytes: int) -> EncodedLayer:
    """Every tensor as `chunked`, its bytes in TensorChunk messages of <= chunk_bytes."""
    base = _base(layer)
    chunks: List[List[_wire.Part]] = []
    for name, v in views.items():
        tensor = getattr(base, name)
        tensor.dtype = v.dtype
        tensor.shape.extend(v.shape)
        tensor.chunked.total_bytes = v.nbytes
        data = v.host_bytes()
        for offset in range(0, v.nbytes, chunk_bytes):
            piece = data[offset:offset + chunk_bytes]
            chunks.append(_wire.session_chunk(base.layer_id, _wire.TENSOR_SLOTS[name], offset,
                                              piece))
    return EncodedLayer([base.SerializeToString()], chunks,
                        sum(v.nbytes for v in views.values()))


# slice_for(name, view) -> ("host_shm" | "cuda_ipc", RegionSlice)
SliceFn = Callable[[str, TensorView], Tuple[str, pb.RegionSlice]]


def encode_regions(layer: Layer, views: Dict[str, TensorView], slice_for: SliceFn,
                   ready_event_id: Optional[str] = None,
                   output: Optional[pb.RegionSlice] = None) -> EncodedLayer:
    """Every tensor as a RegionSlice (host_shm or cuda_ipc) given by `slice_for`; `output`:
    a cuda_ipc slice kvtrim writes the kept lists into (LayerInput.output)."""
    base = _base(layer)
    for name, v in views.items():
        tensor = getattr(base, name)
        tensor.dtype = v.dtype
        tensor.shape.extend(v.shape)
        kind, region_slice = slice_for(name, v)
        getattr(tensor, kind).CopyFrom(region_slice)
    if ready_event_id:
        base.ready_event_id = ready_event_id
    if output is not None:
        base.output.cuda_ipc.CopyFrom(output)
    return EncodedLayer([base.SerializeToString()], nbytes=0)
