"""Hand-built Compress requests over host shared memory: tensors as RegionSlices of a
segment registered on a lease, kept lists written by kvtrimd into an output region of the
same segment (LayerInput.output.host_shm), and the CSR read back from it."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from kvtrim.v1 import kvtrim_pb2 as pb

COMPRESS = "/kvtrim.v1.Kvtrim/Compress"
CLIENT_ID = "kvtrim-client-id"
_DTYPES = {"f16": pb.DTYPE_F16, "bf16": pb.DTYPE_BF16, "f32": pb.DTYPE_F32}


def compress_call(channel: grpc.Channel):
    """The Compress multicallable of `channel` on CompressRequest / CompressResponse."""
    return channel.unary_unary(COMPRESS, request_serializer=pb.CompressRequest.SerializeToString,
                               response_deserializer=pb.CompressResponse.FromString)


def region_tensor(dtype: str, shape: Sequence[int], region_id: str, offset: int) -> pb.Tensor:
    """A Tensor in a host_shm region at byte `offset` (dense)."""
    tensor = pb.Tensor(dtype=_DTYPES[dtype], shape=list(shape))
    tensor.host_shm.region_id = region_id
    tensor.host_shm.offset_bytes = offset
    return tensor


def output_lists(hkv: int, output_shape: Optional[str]) -> int:
    """Kept lists a layer answers: H_kv per head, one shared / block-aligned list."""
    return hkv if output_shape in (None, "per_head", "equal_count") else 1


def output_bytes(lists: int, n: int) -> int:
    """Bytes an output region must hold: int64 offsets [L + 1], int32 indices [L * n]."""
    return 8 * (lists + 1) + 4 * lists * n


def layer_input(layer_id: int, dtype: str, shapes: Dict[str, Tuple[int, ...]],
                offsets: Dict[str, int], region_id: str,
                output_offset: Optional[int] = None) -> pb.LayerInput:
    """A LayerInput whose tensors are host_shm slices of `region_id` (and, when
    `output_offset` is given, whose kept lists go to that offset of the same region)."""
    layer = pb.LayerInput(layer_id=layer_id)
    for name, offset in offsets.items():
        getattr(layer, name).CopyFrom(region_tensor(dtype, shapes[name], region_id, offset))
    if output_offset is not None:
        layer.output.host_shm.region_id = region_id
        layer.output.host_shm.offset_bytes = output_offset
    return layer


def read_output(buffer: np.ndarray, offset: int, lists: int) -> List[np.ndarray]:
    """The CSR lists kvtrimd wrote at `offset` of `buffer` (ValueError when malformed)."""
    offsets = buffer[offset:offset + 8 * (lists + 1)].view(np.int64)
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ValueError(f"output offsets {offsets.tolist()} are not a CSR")
    base = offset + 8 * (lists + 1)
    indices = buffer[base:base + 4 * int(offsets[-1])].view(np.int32)
    return [indices[offsets[i]:offsets[i + 1]].copy() for i in range(lists)]
