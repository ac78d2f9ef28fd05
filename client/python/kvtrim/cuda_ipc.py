"""CUDA IPC regions from torch tensors: the allocation behind a tensor is exported with the
driver API (cuMemGetAddressRange + cuIpcGetMemHandle, through ctypes, so nothing of torch's
own IPC reference counting is involved) and registered once per allocation on the lease;
tensors then travel as RegionSlices with their own strides (any layout torch gives). One
interprocess CUDA event per device orders kvtrimd's reads after the worker's writes."""

from __future__ import annotations

import ctypes
import threading
import uuid as uuid_module
from collections import OrderedDict
from typing import Dict, Optional, Tuple

from .errors import KvtrimError
from .regions import RegionLease
from .tensors import TensorView
from .v1 import kvtrim_pb2 as pb

import grpc

_driver = None


def _cuda_driver():
    """libcuda.so.1 through ctypes (loaded once)."""
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(result: int, what: str) -> None:
    """Raises KvtrimError INTERNAL naming `what` on a CUresult other than CUDA_SUCCESS."""
    if result != 0:
        raise KvtrimError(grpc.StatusCode.INTERNAL, f"{what} failed with CUresult {result}")


def allocation_of(pointer: int) -> Tuple[int, int]:
    """(base, size) of the CUDA allocation that holds device `pointer`."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_cuda_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                  ctypes.c_uint64(pointer)),
           "cuMemGetAddressRange")
    return base.value, size.value


def ipc_handle(base: int) -> bytes:
    """The 64-byte cudaIpcMemHandle of the allocation at `base` (cudaMalloc memory; VMM /
    expandable-segments memory is refused by the driver)."""
    handle = (ctypes.c_char * 64)()
    _check(_cuda_driver().cuIpcGetMemHandle(handle, ctypes.c_uint64(base)),
           "cuIpcGetMemHandle (is PYTORCH_CUDA_ALLOC_CONF=expandable_segments set?)")
    return bytes(handle)


def device_uuid(device_index: int) -> bytes:
    """The 16-byte UUID of CUDA device `device_index` (cudaDeviceProp.uuid)."""
    import torch

    text = str(torch.cuda.get_device_properties(device_index).uuid)
    return uuid_module.UUID(text.replace("GPU-", "")).bytes


class CudaRegions:
    """The CUDA IPC regions and ready events of one lease, registered on first use and
    released least-recently-used first when the lease's region limit is reached."""

    def __init__(self, lease: RegionLease):
        self._lease = lease
        self._regions: "OrderedDict[bytes, str]" = OrderedDict()
        self._events: Dict[int, Tuple[object, str]] = {}
        self._lock = threading.Lock()

    def slice_of(self, view: TensorView) -> pb.RegionSlice:
        """The RegionSlice of a CUDA torch tensor (its allocation registered if new)."""
        tensor = view.source
        device = tensor.device.index if tensor.device.index is not None else 0
        return self.slice_at(tensor.data_ptr(), device, view.strides)

    def slice_at(self, pointer: int, device: int, strides=()) -> pb.RegionSlice:
        """The RegionSlice of device memory at `pointer` on `device` (strides in elements;
        empty = dense), its allocation registered if new."""
        import torch

        if torch.cuda.current_device() == device:
            base, size = allocation_of(pointer)
            handle = ipc_handle(base)
        else:
            with torch.cuda.device(device):  # the driver calls need the device's context
                base, size = allocation_of(pointer)
                handle = ipc_handle(base)
        with self._lock:
            region_id = self._regions.get(handle)
            if region_id is None:
                region_id = self._register(handle, device, size)
            else:
                self._regions.move_to_end(handle)
        return pb.RegionSlice(region_id=region_id, offset_bytes=pointer - base,
                              strides_elements=list(strides))

    def _register(self, handle: bytes, device: int, size: int) -> str:
        """Registers one allocation, first releasing the oldest when at the limit."""
        limit = max(1, self._lease.max_regions - len(self._events) - 2)
        while len(self._regions) >= limit:
            _, old = self._regions.popitem(last=False)
            try:
                self._lease.unregister(old)
            except KvtrimError:
                pass
        region_id = self._lease.register_cuda_ipc(handle, device, device_uuid(device), size)
        self._regions[handle] = region_id
        return region_id

    def record_ready(self, device: int) -> Optional[str]:
        """The ready event for tensors written on torch's current stream of `device`: None
        when that stream has no pending work (the tensors are complete: kvtrimd need not
        wait), else this device's interprocess event recorded on it, by its registered id
        (LayerInput.ready_event_id)."""
        import torch

        stream = torch.cuda.current_stream(device)
        if stream.query():
            return None
        with self._lock:
            entry = self._events.get(device)
            event = entry[0] if entry else torch.cuda.Event(interprocess=True)
            event.record(stream)
            if entry is None:
                event_id = self._lease.register_cuda_ipc_event(bytes(event.ipc_handle()),
                                                               device_uuid(device))
                self._events[device] = (event, event_id)
                return event_id
            return entry[1]
