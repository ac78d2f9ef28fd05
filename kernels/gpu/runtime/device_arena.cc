#include "kernels/gpu/runtime/device_arena.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu {

namespace {

/// Granularity of arena growth.
constexpr size_t kArenaGranule = size_t{2} << 20;

}  // namespace

DeviceArena::~DeviceArena() {
  if (data_ != nullptr) cudaFree(data_);  // nothing to report from a destructor
}

absl::Status DeviceArena::Reserve(size_t bytes) {
  if (bytes <= capacity_) return absl::OkStatus();
  if (limit_bytes_ != 0 && bytes > limit_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the layer needs ", bytes, " bytes of device memory but a GPU worker may hold at most ",
        limit_bytes_, " (--gpu_memory_limit_bytes / --workers); send a smaller layer"));
  }
  size_t want = std::max(bytes, capacity_ + capacity_ / 4);
  want = AlignUp(want, kArenaGranule);
  if (limit_bytes_ != 0) want = std::min(want, std::max(bytes, limit_bytes_));
  if (data_ != nullptr) {
    const cudaError_t freed = cudaFree(data_);
    data_ = nullptr;
    capacity_ = 0;
    KVTRIM_CUDA_RETURN_IF_ERROR(freed, "cudaFree(arena)");
  }
  void* fresh = nullptr;
  cudaError_t err = cudaMalloc(&fresh, want);
  if (err == cudaErrorMemoryAllocation && want > bytes) {
    cudaGetLastError();  // clear the failed attempt; retry with the exact size
    err = cudaMalloc(&fresh, bytes);
    want = bytes;
  }
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky: leave no error behind
    return CudaStatus(err, absl::StrCat("cudaMalloc(", want, " bytes of worker arena)"));
  }
  data_ = fresh;
  capacity_ = want;
  return absl::OkStatus();
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

absl::Status PinnedBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return absl::OkStatus();
  const size_t want = AlignUp(std::max(bytes, capacity_ + capacity_ / 4), size_t{64} << 10);
  if (data_ != nullptr) {
    const cudaError_t freed = cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
    KVTRIM_CUDA_RETURN_IF_ERROR(freed, "cudaFreeHost(staging)");
  }
  void* fresh = nullptr;
  const cudaError_t err = cudaMallocHost(&fresh, want);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, absl::StrCat("cudaMallocHost(", want, " bytes of pinned staging)"));
  }
  data_ = static_cast<char*>(fresh);
  capacity_ = want;
  return absl::OkStatus();
}

size_t ArenaLayout::Add(size_t bytes) {
  const size_t offset = total_;
  total_ = AlignUp(total_ + bytes, kArenaAlignment);
  return offset;
}

}  // namespace kvtrim::gpu
