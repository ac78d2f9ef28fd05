// LaunchApplyProtection (launchers.h): the GPU twin of ApplyProtection in
// kernels/cpu/cpu_backend.cc. Protected tokens score +inf so that every selector keeps them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

namespace {

constexpr int kThreads = 256;

/// Sets scores [H, n] to +inf at tokens [0, sink) and [n - recent, n) of head blockIdx.y.
/// The protected tokens are listed as sink tokens then recent tokens; an index in both
/// ranges is written twice with the same value. Grid (x, H).
__global__ void ProtectKernel(float* scores, int64_t n, int64_t sink, int64_t recent) {
  float* s = scores + static_cast<int64_t>(blockIdx.y) * n;
  const int64_t listed = sink + recent;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < listed;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = t < sink ? t : n - recent + (t - sink);
    s[j] = INFINITY;
  }
}

}  // namespace

cudaError_t LaunchApplyProtection(float* scores, int32_t num_heads, int64_t n, int64_t sink,
                                  int64_t recent, cudaStream_t stream) {
  if (num_heads < 0 || n < 0 || num_heads > 65535) return cudaErrorInvalidValue;
  // Same clamping as the CPU: sink tokens j < min(sink, n), recent tokens j >= n - recent.
  sink = std::clamp<int64_t>(sink, 0, n);
  recent = std::clamp<int64_t>(recent, 0, n);
  if (num_heads == 0 || sink + recent == 0) return cudaSuccess;
  if (scores == nullptr) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((sink + recent + kThreads - 1) / kThreads, 1024);
  ProtectKernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(num_heads)), kThreads,
                  0, stream>>>(scores, n, sink, recent);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
