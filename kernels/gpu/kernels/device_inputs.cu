#include "kernels/gpu/kernels/device_inputs.h"

#include <algorithm>

namespace kvtrim::gpu {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 256;

/// Element offset (in elements) of row (i0, i1) of the source.
__device__ __forceinline__ int64_t RowOffset(const DeviceStridedLayout& l, int64_t i0,
                                             int64_t i1) {
  int64_t token;
  if (l.block_tokens > 0) {
    token = static_cast<int64_t>(l.block_table[i1 / l.block_tokens]) * l.block_stride +
            (i1 % l.block_tokens) * l.strides[1];
  } else {
    token = i1 * l.strides[1];
  }
  return i0 * l.strides[0] + token;
}

/// One warp per destination row; `vectorized`: the row is contiguous and every row start
/// (source and destination) is 16-byte aligned.
template <typename T>
__global__ void GatherKernel(const T* __restrict__ src, DeviceStridedLayout layout,
                             T* __restrict__ dst, bool vectorized) {
  const int64_t rows = layout.shape[0] * layout.shape[1];
  const int64_t c = layout.shape[2];
  const int lane = threadIdx.x % 32;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp; row < rows; row += warps) {
    const int64_t i0 = row / layout.shape[1];
    const int64_t i1 = row % layout.shape[1];
    const T* in = src + RowOffset(layout, i0, i1);
    T* out = dst + row * c;
    if (vectorized) {
      const int64_t vectors = c * static_cast<int64_t>(sizeof(T)) / 16;
      const uint4* vin = reinterpret_cast<const uint4*>(in);
      uint4* vout = reinterpret_cast<uint4*>(out);
      for (int64_t j = lane; j < vectors; j += 32) vout[j] = vin[j];
    } else {
      for (int64_t j = lane; j < c; j += 32) out[j] = in[j * layout.strides[2]];
    }
  }
}

/// True when a dtype element at `bits` is NaN or Inf.
__device__ __forceinline__ bool NonFinite16(uint16_t bits, uint16_t exponent_mask) {
  return (bits & exponent_mask) == exponent_mask;
}

/// Grid-stride scan over raw elements; one atomicMin per thread that found one.
__global__ void FindFirstNonFiniteKernel(const void* __restrict__ data, int dtype, int64_t count,
                                         unsigned long long* first_bad) {
  unsigned long long best = ~0ull;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    bool bad;
    if (dtype == static_cast<int>(DType::kF32)) {
      bad = !isfinite(static_cast<const float*>(data)[i]);
    } else {
      const uint16_t bits = static_cast<const uint16_t*>(data)[i];
      bad = NonFinite16(bits, dtype == static_cast<int>(DType::kF16) ? 0x7C00u : 0x7F80u);
    }
    if (bad) {
      best = static_cast<unsigned long long>(i);
      break;  // later indices of this thread are larger
    }
  }
  if (best != ~0ull) atomicMin(first_bad, best);
}

}  // namespace

cudaError_t LaunchGatherStrided(const void* src, const DeviceStridedLayout& layout,
                                int element_bytes, void* dst, cudaStream_t stream) {
  const int64_t rows = layout.shape[0] * layout.shape[1];
  if (rows <= 0 || layout.shape[2] <= 0) return cudaSuccess;
  const int64_t row_bytes = layout.shape[2] * element_bytes;
  // Vectorized rows: contiguous, whole 16-byte vectors, and every row start aligned (the
  // base and every row / block stride a multiple of 16 bytes).
  bool vectorized = layout.strides[2] == 1 && row_bytes % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                    (layout.strides[0] * element_bytes) % 16 == 0 &&
                    (layout.strides[1] * element_bytes) % 16 == 0 &&
                    (layout.block_tokens == 0 || (layout.block_stride * element_bytes) % 16 == 0);
  const int64_t blocks = std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 65535);
  if (element_bytes == 2) {
    GatherKernel<uint16_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(src), layout, static_cast<uint16_t*>(dst), vectorized);
  } else {
    GatherKernel<uint32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(src), layout, static_cast<uint32_t*>(dst), vectorized);
  }
  return cudaGetLastError();
}

cudaError_t LaunchFindFirstNonFinite(const void* data, DType dtype, int64_t count,
                                     unsigned long long* first_bad, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(first_bad, 0xFF, sizeof(unsigned long long), stream);
  if (err != cudaSuccess || count <= 0) return err;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 2048);
  FindFirstNonFiniteKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      data, static_cast<int>(dtype), count, first_bad);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
