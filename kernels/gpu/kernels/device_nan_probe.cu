#include "kernels/gpu/kernels/device_nan_probe.h"

#include <algorithm>

namespace kvtrim::gpu {

namespace {

constexpr int kThreads = 256;

/// Grid-stride scan; each thread keeps its lowest NaN index, one atomicMin per thread that
/// found one.
__global__ void FindFirstNaNKernel(const float* __restrict__ values, int64_t count,
                                   unsigned long long* first_nan) {
  unsigned long long best = kNoNaN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    if (isnan(values[i])) {
      best = static_cast<unsigned long long>(i);
      break;  // later indices of this thread are larger
    }
  }
  if (best != kNoNaN) atomicMin(first_nan, best);
}

}  // namespace

cudaError_t LaunchFindFirstNaN(const float* values, int64_t count, unsigned long long* first_nan,
                               cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(first_nan, 0xFF, sizeof(unsigned long long), stream);
  if (err != cudaSuccess || count <= 0) return err;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 1024);
  FindFirstNaNKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(values, count,
                                                                              first_nan);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
