"""Host shared memory of one soak client: placing layers in a segment, and a segment of the
client's own registered on its lease for hand-built requests (region tensors and output
regions that kvtrim.Client does not send on the CPU)."""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Dict, Tuple

import numpy as np

ALIGN = 256


def aligned(n: int) -> int:
    """`n` rounded up to a multiple of ALIGN bytes."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def place(buffer: np.ndarray, arrays: Dict[str, np.ndarray], start: int
          ) -> Tuple[Dict[str, np.ndarray], Dict[str, int], int]:
    """Copies `arrays` into the uint8 `buffer` from byte `start` (each ALIGN-aligned).
    Returns typed views of the copies, their byte offsets and the first free offset."""
    views, offsets, offset = {}, {}, aligned(start)
    for name, array in arrays.items():
        size = array.nbytes
        if offset + size > buffer.size:
            raise ValueError(f"segment of {buffer.size} bytes cannot hold {name} at {offset}")
        view = buffer[offset:offset + size].view(array.dtype).reshape(array.shape)
        np.copyto(view, array)
        views[name], offsets[name] = view, offset
        offset = aligned(offset + size)
    return views, offsets, offset


class RawSegment:
    """A POSIX shm segment created here and registered on `lease` (its region id)."""

    def __init__(self, lease, size: int):
        """Creates a segment of `size` bytes and registers it on `lease`."""
        self._memory = shared_memory.SharedMemory(create=True, size=size)
        try:
            self.region_id = lease.register_host_shm("/" + self._memory.name.lstrip("/"),
                                                     self._memory.size)
        except Exception:
            self._memory.close()
            self._memory.unlink()
            raise
        self.buffer = np.frombuffer(self._memory.buf, dtype=np.uint8)

    @property
    def size(self) -> int:
        """Bytes of the segment."""
        return self.buffer.size

    def close(self) -> None:
        """Unmaps and unlinks the segment (kvtrimd drops its mapping with the lease)."""
        self.buffer = None
        try:
            self._memory.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with it
        try:
            self._memory.unlink()
        except FileNotFoundError:
            pass
