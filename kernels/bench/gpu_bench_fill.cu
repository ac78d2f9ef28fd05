#include "kernels/bench/gpu_bench_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace kvtrim::gpu::bench {

namespace {

/// SplitMix64 finaliser: a well-mixed 64-bit hash of x.
__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Sum of four 16-bit uniforms of one hash: mean 2, variance 4/12; centred and scaled to
/// unit variance.
__device__ __forceinline__ float PseudoNormal(uint64_t seed, int64_t i) {
  const uint64_t h = Mix(seed * 0xD1B54A32D192ED03ull ^ static_cast<uint64_t>(i));
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) sum += static_cast<float>((h >> (16 * k)) & 0xFFFF) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;  // sqrt(12 / 4)
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void FillKernel(T* data, int64_t count, uint64_t seed, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    data[i] = FromFloat<T>(scale * PseudoNormal(seed, i));
  }
}

}  // namespace

cudaError_t LaunchFillPseudoNormal(void* data, DType dtype, int64_t count, uint64_t seed,
                                   float scale, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (data == nullptr) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535));
  switch (dtype) {
    case DType::kF32:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(data), count, seed, scale);
      break;
    case DType::kF16:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(data), count, seed, scale);
      break;
    case DType::kBF16:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, seed,
                                                  scale);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu::bench
