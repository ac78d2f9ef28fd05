#include "kernels/gpu/kernels/device_inputs.h"

#include <algorithm>
#include <cstdint>
#include <utility>

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

/// Grid-stride scan over the raw elements [begin, end); one atomicMin per thread that found
/// one. Covers the parts of a tensor the vector scan below leaves out.
__global__ void FindFirstNonFiniteKernel(const void* __restrict__ data, int dtype, int64_t begin,
                                         int64_t end, unsigned long long* first_bad) {
  unsigned long long best = ~0ull;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
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

constexpr int kVectorsInFlight = 4;  // 16-byte loads per thread and step

/// The lowest lane (element) of 16-byte vector `v` that is NaN or Inf, or -1: four f32 or
/// eight 16-bit elements (exponent field all ones).
__device__ __forceinline__ int FirstBadLane(const uint4& v, bool f32, uint32_t mask16) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if (f32) {
      if ((words[w] & 0x7F800000u) == 0x7F800000u) return w;
    } else {
      if ((words[w] & mask16) == mask16) return 2 * w;
      if (((words[w] >> 16) & mask16) == mask16) return 2 * w + 1;
    }
  }
  return -1;
}

/// Grid-stride scan over 16-byte vectors vec[0, vectors) (element `first` + lane of vector
/// v is element first + v * per + lane), kVectorsInFlight loads in flight per thread, visited
/// in ascending order per thread so that its first hit is its lowest; one atomicMin per thread
/// that found one.
__global__ void FindFirstNonFiniteVectorKernel(const uint4* __restrict__ vec, int64_t vectors,
                                               int dtype, int64_t first,
                                               unsigned long long* first_bad) {
  const bool f32 = dtype == static_cast<int>(DType::kF32);
  const uint32_t mask16 = dtype == static_cast<int>(DType::kF16) ? 0x7C00u : 0x7F80u;
  const int per = f32 ? 4 : 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v0 < vectors;
       v0 += kVectorsInFlight * stride) {
    uint4 x[kVectorsInFlight];
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
      const int64_t v = v0 + k * stride;
      x[k] = v < vectors ? __ldcs(vec + v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
      const int lane = FirstBadLane(x[k], f32, mask16);
      if (lane >= 0) {
        atomicMin(first_bad, static_cast<unsigned long long>(first + (v0 + k * stride) * per + lane));
        return;  // this thread's later vectors hold larger indices
      }
    }
  }
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
  // The 16-byte aligned body as vectors, the elements before and after it one by one.
  const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
  const auto address = reinterpret_cast<uintptr_t>(data);
  int64_t head = address % size != 0 ? count
                                     : static_cast<int64_t>((16 - address % 16) % 16) / size;
  head = std::min(head, count);
  const int64_t per = 16 / size;
  const int64_t vectors = (count - head) / per;
  const int64_t body_end = head + vectors * per;
  if (vectors > 0) {
    const int64_t blocks =
        std::min<int64_t>((vectors + kThreads * kVectorsInFlight - 1) / (kThreads * kVectorsInFlight),
                          2048);
    FindFirstNonFiniteVectorKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(static_cast<const char*>(data) + head * size), vectors,
        static_cast<int>(dtype), head, first_bad);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  for (const auto [begin, end] : {std::pair<int64_t, int64_t>{0, head}, {body_end, count}}) {
    if (end <= begin) continue;
    const int64_t blocks = std::min<int64_t>((end - begin + kThreads - 1) / kThreads, 2048);
    FindFirstNonFiniteKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        data, static_cast<int>(dtype), begin, end, first_bad);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace kvtrim::gpu
