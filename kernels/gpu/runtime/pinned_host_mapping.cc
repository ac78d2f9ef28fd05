#include "kernels/gpu/runtime/pinned_host_mapping.h"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtrim::gpu {

absl::StatusOr<std::unique_ptr<PinnedHostMapping>> PinnedHostMapping::Map(
    int device, int fd, uint64_t size_bytes, const std::string& field) {
  if (size_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".size_bytes: must be >= 1"));
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(err)));
  }
  void* base = mmap(nullptr, size_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot map ", size_bytes,
                                                   " bytes of the segment: ",
                                                   std::strerror(errno)));
  }
  // Portable: pinned for every device kvtrimd serves; read-only: the mapping is PROT_READ.
  const cudaError_t err = cudaHostRegister(
      base, size_bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for this thread
    munmap(base, size_bytes);
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the driver cannot page-lock the segment's ", size_bytes, " bytes: ",
        cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
  return std::unique_ptr<PinnedHostMapping>(
      new PinnedHostMapping(static_cast<char*>(base), size_bytes));
}

PinnedHostMapping::~PinnedHostMapping() {
  cudaHostUnregister(base_);
  cudaGetLastError();
  munmap(base_, bytes_);
}

bool LockHostMemory(int device, void* data, size_t bytes) {
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaHostRegister(data, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for this thread
    return false;
  }
  return true;
}

void UnlockHostMemory(void* data) {
  cudaHostUnregister(data);
  cudaGetLastError();
}

}  // namespace kvtrim::gpu
