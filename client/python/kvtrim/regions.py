"""The Regions lease: the stream on which a same-node client registers its memory (POSIX
shared-memory segments, CUDA IPC allocations and events) so tensors travel as RegionSlices,
never as bytes. Every region dies with the stream (kvtrimd releases them all when it ends)."""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Optional, Sequence, Tuple

import grpc

from .errors import KvtrimError
from .v1 import kvtrim_pb2 as pb

_REGIONS_METHOD = "/kvtrim.v1.Kvtrim/Regions"


class RegionLease:
    """One Regions stream: its client id, and register / unregister requests answered in
    order. Thread-safe (one request at a time). Use as a context manager or call close()."""

    def __init__(self, channel: grpc.Channel, metadata: Sequence[Tuple[str, str]] = ()):
        """Opens the stream and reads the lease. KvtrimError FAILED_PRECONDITION naming
        --allow_client_shm when kvtrimd does not allow regions."""
        self._requests: "queue.Queue[Optional[pb.RegionRequest]]" = queue.Queue()
        self._lock = threading.Lock()
        self._tags = itertools.count(1)
        call = channel.stream_stream(_REGIONS_METHOD,
                                     request_serializer=pb.RegionRequest.SerializeToString,
                                     response_deserializer=pb.RegionResponse.FromString)
        self._call = call(iter(self._requests.get, None), metadata=list(metadata))
        self._closed = False
        try:
            first = next(self._call)
        except grpc.RpcError as error:
            raise KvtrimError.from_rpc_error(error) from None
        if not first.HasField("lease"):
            self.close()
            raise KvtrimError(grpc.StatusCode.INTERNAL, "Regions: first answer is not the lease")
        self.client_id: str = first.lease.client_id
        self.max_regions: int = first.lease.max_regions

    def _request(self, request: pb.RegionRequest) -> pb.RegionResponse:
        """Sends `request` and returns its answer; KvtrimError on its failure status."""
        with self._lock:
            if self._closed:
                raise KvtrimError(grpc.StatusCode.FAILED_PRECONDITION, "region lease closed")
            request.tag = next(self._tags)
            self._requests.put(request)
            try:
                answer = next(self._call)
            except (grpc.RpcError, StopIteration) as error:
                self._closed = True
                if isinstance(error, grpc.RpcError):
                    raise KvtrimError.from_rpc_error(error) from None
                raise KvtrimError(grpc.StatusCode.UNAVAILABLE, "Regions stream ended") from None
        if answer.tag != request.tag:
            raise KvtrimError(grpc.StatusCode.INTERNAL,
                              f"Regions: answer tag {answer.tag} for request {request.tag}")
        if answer.code != 0:
            raise KvtrimError.from_code_number(answer.code, answer.message)
        return answer

    def register_host_shm(self, name: str, size_bytes: int) -> str:
        """Registers the POSIX shm segment `name` ("/..."); returns the region id."""
        region = pb.RegisterRegion(host_shm=pb.HostShmRegion(name=name, size_bytes=size_bytes))
        return self._request(pb.RegionRequest(register_region=region)).registered_region_id

    def register_cuda_ipc(self, handle: bytes, device: int, device_uuid: bytes,
                          size_bytes: int) -> str:
        """Registers a cudaIpcMemHandle (64 bytes) of an allocation's base; returns its id."""
        region = pb.RegisterRegion(cuda_ipc=pb.CudaIpcRegion(
            handle=handle, device=device, device_uuid=device_uuid, size_bytes=size_bytes))
        return self._request(pb.RegionRequest(register_region=region)).registered_region_id

    def register_cuda_ipc_event(self, handle: bytes, device_uuid: bytes) -> str:
        """Registers a cudaIpcEventHandle (64 bytes); returns the event id."""
        region = pb.RegisterRegion(cuda_ipc_event=pb.CudaIpcEvent(handle=handle,
                                                                 device_uuid=device_uuid))
        return self._request(pb.RegionRequest(register_region=region)).registered_region_id

    def unregister(self, region_id: str) -> None:
        """Releases one region (FAILED_PRECONDITION while a running layer reads it)."""
        request = pb.RegionRequest(unregister_region=pb.UnregisterRegion(region_id=region_id))
        self._request(request)

    def close(self) -> None:
        """Ends the stream: kvtrimd releases every region of the lease."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._requests.put(None)
            try:
                for _ in self._call:
                    pass
            except grpc.RpcError:
                pass

    @property
    def closed(self) -> bool:
        """The stream has ended."""
        return self._closed

    def __enter__(self) -> "RegionLease":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
