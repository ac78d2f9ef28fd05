// Device helpers of the exact key scorers (kernels/gpu/scorers/): readers of
// key tensors in their input dtype, converting to fp32 exactly (as base/dtype.h does on the
// CPU), the canonical 8-lane dot-product pieces that let eight consecutive threads of a warp
// compute CmDot (canonical_math.h) bit for bit, and the grid size of their kernels.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/canonical_math.h"
#include "base/dtype.h"

namespace kvtrim::gpu {

/// Threads per block of the exact key kernels.
constexpr int kKeyThreads = 256;

/// Blocks per head for a grid-stride loop of kKeyThreads-thread blocks over `items` items of
/// one head (at least 1, at most 2048).
inline unsigned KeyBlocksPerHead(int64_t items) {
  const int64_t blocks = (items + kKeyThreads - 1) / kKeyThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 2048 ? 2048 : blocks));
}

/// The grid of an exact key kernel: KeyBlocksPerHead(items_per_head) blocks in x, one head
/// per y (heads <= 65535: CheckTableLaunch).
inline dim3 KeyGrid(int64_t items_per_head, int32_t heads) {
  return dim3(KeyBlocksPerHead(items_per_head), static_cast<unsigned>(heads));
}

/// fp32 elements.
struct F32Keys {
  const float* p;  // [count] fp32
  __device__ __forceinline__ float operator[](int64_t i) const { return p[i]; }
};

/// IEEE binary16 elements, widened exactly (subnormals included).
struct F16Keys {
  const __half* p;  // [count] f16
  __device__ __forceinline__ float operator[](int64_t i) const { return __half2float(p[i]); }
};

/// bfloat16 elements, widened exactly (the 16 bits become the top half of the fp32).
struct Bf16Keys {
  const uint16_t* p;  // [count] bf16 bit patterns
  __device__ __forceinline__ float operator[](int64_t i) const {
    return __uint_as_float(static_cast<uint32_t>(p[i]) << 16);
  }
};

/// Calls fn(reader) with the reader of `data` for `dtype` (host side, picks the kernel).
template <typename Fn>
auto WithKeyReader(DType dtype, const void* data, Fn&& fn) {
  switch (dtype) {
    case DType::kF16:
      return fn(F16Keys{static_cast<const __half*>(data)});
    case DType::kBF16:
      return fn(Bf16Keys{static_cast<const uint16_t*>(data)});
    case DType::kF32:
    default:
      return fn(F32Keys{static_cast<const float*>(data)});
  }
}

/// Lane `lane` (0..7) of the canonical dot product of the key k = keys[row .. row + d) with
/// itself: the CmAdd of CmMul(a[c], a[c]) over c = lane, lane + 8, ... < d in increasing c,
/// starting from +0.
template <typename Keys>
__device__ __forceinline__ float CanonicalSquareLane(const Keys& keys, int64_t row, int d,
                                                     int lane) {
  float acc = 0.0f;
  for (int c = lane; c < d; c += kCanonicalLanes) {
    const float x = keys[row + c];
    acc = CmAdd(acc, CmMul(x, x));
  }
  return acc;
}

/// Lane `lane` (0..7) of the canonical dot product of the key keys[row .. row + d) with
/// `b` [d] fp32 (shared or global memory), in the same order.
template <typename Keys>
__device__ __forceinline__ float CanonicalDotLane(const Keys& keys, int64_t row, const float* b,
                                                  int d, int lane) {
  float acc = 0.0f;
  for (int c = lane; c < d; c += kCanonicalLanes) acc = CmAdd(acc, CmMul(keys[row + c], b[c]));
  return acc;
}

/// Combines the eight lane sums held by eight consecutive, 8-aligned threads of a warp into
/// CmDot's ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); every one of the eight gets
/// the result (fp32 addition is commutative bit for bit). All 32 threads of the warp must
/// call it together.
__device__ __forceinline__ float CombineCanonicalLanes(float v) {
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 2));
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 4));
  return v;
}

}  // namespace kvtrim::gpu
