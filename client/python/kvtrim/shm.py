"""Host shared memory for the host_shm transport: segments this process creates, registers
on its lease and addresses by RegionSlice. `SharedArrays.empty` hands out NumPy arrays that
live in a registered segment (zero copy: kvtrimd reads them in place); other host tensors
are copied into a reusable staging segment."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .regions import RegionLease
from .tensors import TensorView, itemsize
from .v1 import kvtrim_pb2 as pb

_ALIGN = 256


def _align(n: int) -> int:
    """`n` rounded up to a multiple of 256 bytes."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass
class _Segment:
    """One registered segment: its mapping, kvtrim region id and address range."""

    memory: shared_memory.SharedMemory
    region_id: str
    address: int
    size: int

    def release(self) -> None:
        """Unmaps and unlinks the segment (kvtrimd's own mapping is released with the lease
        or by unregister)."""
        try:
            self.memory.close()
        except BufferError:
            pass  # arrays still view it; the mapping goes with them
        try:
            self.memory.unlink()
        except FileNotFoundError:
            pass


def _create(lease: RegionLease, size: int) -> _Segment:
    """A new segment of `size` bytes registered on `lease`."""
    memory = shared_memory.SharedMemory(create=True, size=max(size, 1))
    try:
        region_id = lease.register_host_shm("/" + memory.name.lstrip("/"), memory.size)
    except Exception:
        memory.close()
        memory.unlink()
        raise
    address = np.frombuffer(memory.buf, dtype=np.uint8).__array_interface__["data"][0]
    return _Segment(memory, region_id, address, memory.size)


class SharedArrays:
    """Shared-memory segments of one lease: user arrays (zero copy) and a staging segment."""

    def __init__(self, lease: RegionLease):
        self._lease = lease
        self._user: List[_Segment] = []
        self._staging: Optional[_Segment] = None
        self.lock = threading.Lock()  # held while a call uses the staging segment

    def empty(self, shape: Sequence[int], dtype) -> np.ndarray:
        """A new array in its own registered segment; compress reads it without copies."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape)) * dtype.itemsize
        segment = _create(self._lease, size)
        self._user.append(segment)
        return np.ndarray(tuple(shape), dtype=dtype, buffer=segment.memory.buf)

    def find(self, view: TensorView) -> Optional[Tuple[str, int]]:
        """(region id, byte offset) when `view` lies inside a user segment, else None."""
        if not isinstance(view.source, np.ndarray):
            return None
        address = view.source.__array_interface__["data"][0]
        size = itemsize(view.dtype)
        last = address + sum((n - 1) * s for n, s in zip(view.shape, view.strides)) * size
        for segment in self._user:
            if segment.address <= address and last + size <= segment.address + segment.size:
                return segment.region_id, address - segment.address
        return None

    def stage(self, views: Sequence[TensorView]) -> List[Tuple[str, int]]:
        """Copies `views` densely into the staging segment (grown as needed); returns each
        one's (region id, offset). Call with `lock` held until the answer has arrived."""
        total = sum(_align(v.nbytes) for v in views)
        if self._staging is None or self._staging.size < total:
            if self._staging is not None:
                self._lease.unregister(self._staging.region_id)
                self._staging.release()
                self._staging = None
            self._staging = _create(self._lease, max(total * 5 // 4, 1 << 20))
        buffer = np.frombuffer(self._staging.memory.buf, dtype=np.uint8)
        placed, offset = [], 0
        for v in views:
            data = np.frombuffer(v.host_bytes(), dtype=np.uint8)
            buffer[offset:offset + data.size] = data
            placed.append((self._staging.region_id, offset))
            offset += _align(v.nbytes)
        return placed

    def close(self) -> None:
        """Unlinks every segment (call after the lease has closed)."""
        for segment in self._user:
            segment.release()
        self._user.clear()
        if self._staging is not None:
            self._staging.release()
            self._staging = None


def region_slice(region_id: str, offset: int, strides: Optional[Sequence[int]] = None
                 ) -> pb.RegionSlice:
    """A RegionSlice; `strides` in elements (None = dense)."""
    return pb.RegionSlice(region_id=region_id, offset_bytes=offset,
                          strides_elements=list(strides or []))
