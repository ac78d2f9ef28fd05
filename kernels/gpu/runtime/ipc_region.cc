#include "kernels/gpu/runtime/ipc_region.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtrim::gpu {

namespace {

/// cuMemGetAddressRange through the runtime's driver entry point (no link to libcuda).
using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

GetAddressRangeFn AddressRangeFunction() {
  static GetAddressRangeFn fn = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &pointer, 12000,
                                         cudaEnableDefault, &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      return static_cast<GetAddressRangeFn>(nullptr);
    }
    return reinterpret_cast<GetAddressRangeFn>(pointer);
  }();
  return fn;
}

std::string CudaText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<IpcMemoryMapping>> IpcMemoryMapping::Open(
    int device, const std::string& handle, uint64_t size_bytes, const std::string& field) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".handle: ", handle.size(),
                                                   " bytes; a cudaIpcMemHandle_t has ",
                                                   sizeof(cudaIpcMemHandle_t)));
  }
  if (size_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".size_bytes: must be >= 1"));
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice(", device, "): ", CudaText(err)));
  }
  cudaIpcMemHandle_t raw;
  std::memcpy(&raw, handle.data(), sizeof raw);
  void* base = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&base, raw, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for this thread
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".handle: the driver cannot open this CUDA IPC handle: ", CudaText(err),
        ". Only cudaMalloc allocations of another process can be shared this way; VMM "
        "(cuMemCreate) and PyTorch expandable-segments memory cannot (set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False, or use host_shm). Across "
        "containers the exporting process must not have kvtrimd's PID: run both in one PID "
        "namespace (shareProcessNamespace, or hostPID for both)"));
  }
  auto mapping = std::unique_ptr<IpcMemoryMapping>(
      new IpcMemoryMapping(device, static_cast<char*>(base)));
  GetAddressRangeFn range = AddressRangeFunction();
  if (range == nullptr) {
    return absl::InternalError("cuMemGetAddressRange is unavailable from the CUDA driver");
  }
  CUdeviceptr start = 0;
  size_t bytes = 0;
  if (range(&start, &bytes, reinterpret_cast<CUdeviceptr>(base)) != CUDA_SUCCESS) {
    return absl::InternalError("cuMemGetAddressRange failed on a freshly opened IPC mapping");
  }
  const uint64_t available =
      static_cast<uint64_t>(bytes) - (reinterpret_cast<CUdeviceptr>(base) - start);
  if (size_bytes > available) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".size_bytes: ", size_bytes,
                                                   " exceeds the shared allocation's ",
                                                   available, " bytes"));
  }
  return mapping;
}

IpcMemoryMapping::~IpcMemoryMapping() {
  if (base_ == nullptr) return;
  cudaSetDevice(device_);
  // Work that reads the mapping has finished (its users synchronised before releasing it).
  if (cudaIpcCloseMemHandle(base_) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<std::unique_ptr<IpcEvent>> IpcEvent::Open(int device, const std::string& handle,
                                                         const std::string& field) {
  if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".handle: ", handle.size(),
                                                   " bytes; a cudaIpcEventHandle_t has ",
                                                   sizeof(cudaIpcEventHandle_t)));
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice(", device, "): ", CudaText(err)));
  }
  cudaIpcEventHandle_t raw;
  std::memcpy(&raw, handle.data(), sizeof raw);
  cudaEvent_t event = nullptr;
  const cudaError_t err = cudaIpcOpenEventHandle(&event, raw);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".handle: the driver cannot open this CUDA IPC event handle: ", CudaText(err),
        " (create the event with cudaEventInterprocess | cudaEventDisableTiming in another "
        "process)"));
  }
  return std::unique_ptr<IpcEvent>(new IpcEvent(device, event));
}

IpcEvent::~IpcEvent() {
  if (event_ == nullptr) return;
  cudaSetDevice(device_);
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event_)) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device); err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaGetDeviceProperties(", device, "): ",
                                            CudaText(err)));
  }
  return std::string(reinterpret_cast<const char*>(prop.uuid.bytes), sizeof prop.uuid.bytes);
}

std::string FormatUuid(const std::string& uuid16) {
  if (uuid16.size() != 16) return absl::StrCat("<", uuid16.size(), "-byte uuid>");
  std::string out = "GPU-";
  char hex[3];
  for (size_t i = 0; i < 16; ++i) {
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(uuid16[i]));
    out += hex;
    if (i == 3 || i == 5 || i == 7 || i == 9) out += '-';
  }
  return out;
}

}  // namespace kvtrim::gpu
