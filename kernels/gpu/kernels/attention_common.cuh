// Device building blocks of the canonical window attention (kernels/cpu/window_attention.h)
// on the GPU: exact dtype widening, the 8-lane canonical dot product spread over eight
// consecutive threads of a warp, and the layout helpers shared by the attention kernels.
//
// Lane scheme: a "token group" is 8 threads of a warp that together hold one d-vector; its
// canonical lane `lane` (0..7) holds elements lane, lane + 8, lane + 16, ... of the vector,
// i.e. exactly the elements CmDot's lane `lane` accumulates, in the same increasing order.
// The 4 token groups of a warp are interleaved: warp lane t has canonical lane (t >> 2) & 7
// and token slot t & 3, so threads t, t^1, t^2, t^3 read the same per-lane vectors from
// shared memory (the LSU then packs LDS.128 returns: twice the shared-memory bandwidth).
// Reducing the 8 lane sums with shuffles xor 4, xor 8, xor 16 (canonical lane bits 0, 1, 2)
// adds them as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), CmDot's final tree (fp32 addition is
// commutative bit for bit).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/canonical_math.h"
#include "kernels/canonical_attention.h"
#include "base/dtype.h"

namespace kvtrim::gpu::attn {

/// Threads per token group (= CmDot lanes).
constexpr int kLanes = kCanonicalLanes;
static_assert(kLanes == 8, "the butterfly below assumes 8 lanes");

/// Warp-lane distance of canonical lane bit 0 (lane bits 0, 1, 2 = warp-lane bits 2, 3, 4).
constexpr int kLaneShift = 2;

/// Canonical lane (0..7) of thread `tid` of a CTA.
__device__ __forceinline__ int LaneOfThread(int tid) { return (tid >> kLaneShift) & 7; }

/// Token group of thread `tid` within its CTA (4 interleaved groups per warp).
__device__ __forceinline__ int GroupOfThread(int tid) {
  return (tid >> 5) * 4 + (tid & ((1 << kLaneShift) - 1));
}

/// Warp lane of canonical lane `lane` in the token group of warp lane `warp_lane`.
__device__ __forceinline__ int WarpLaneOf(int lane, int warp_lane) {
  return (lane << kLaneShift) | (warp_lane & ((1 << kLaneShift) - 1));
}

/// Largest head dimension the attention kernels take (32 elements per lane).
constexpr int kMaxHeadDim = 256;

/// Exact widening of one input element to fp32 (f16/bf16 -> fp32 is exact).
__device__ __forceinline__ float ToF32(float x) { return x; }
__device__ __forceinline__ float ToF32(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 x) { return __bfloat162float(x); }

/// Round-to-nearest-even to bfloat16 and back, bit-identical to kvtrim::RoundToBf16.
__device__ __forceinline__ float RoundToBf16Device(float value) {
  const uint32_t u = __float_as_uint(value);
  uint32_t bits;
  if (value != value) {
    bits = (u >> 16) | 0x40u;
  } else {
    bits = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) & 0xFFFFu;
  }
  return __uint_as_float(bits << 16);
}

/// Smallest stride >= e with stride % 8 == 4: rows of per-lane vectors at this stride
/// (in floats) let the 8 lanes of a group read 16-byte vectors without bank conflicts.
__host__ __device__ constexpr int LaneStride(int e) { return e + ((12 - e % 8) % 8); }

/// Loads lane `lane`'s E elements of the d-vector at `src` (fp32-widened, zero past d).
template <int E, typename T>
__device__ __forceinline__ void LoadLaneVector(const T* __restrict__ src, int d, int lane,
                                               float (&out)[E]) {
#pragma unroll
  for (int m = 0; m < E; ++m) {
    const int i = lane + kLanes * m;
    out[m] = i < d ? ToF32(src[i]) : 0.0f;
  }
}

/// Lane partial of CmDot: CmAdd chain over m of CmMul(x[m], y[m]) from +0, where y is a
/// per-lane vector in shared memory (16-byte aligned, E a multiple of 4).
template <int E>
__device__ __forceinline__ float LanePartial(const float (&x)[E], const float* y) {
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < E; m += 4) {
    const float4 v = *reinterpret_cast<const float4*>(y + m);
    acc = CmAdd(acc, CmMul(v.x, x[m]));
    acc = CmAdd(acc, CmMul(v.y, x[m + 1]));
    acc = CmAdd(acc, CmMul(v.z, x[m + 2]));
    acc = CmAdd(acc, CmMul(v.w, x[m + 3]));
  }
  return acc;
}

/// Lane partials of CmDot for TJ register vectors x[u] against one shared-memory per-lane
/// vector y: out[u] = LanePartial(x[u], y). Each y quad is loaded once for all TJ chains;
/// every chain still runs in increasing element order.
template <int E, int TJ>
__device__ __forceinline__ void LanePartials(const float (&x)[TJ][E], const float* y,
                                             float (&out)[TJ]) {
#pragma unroll
  for (int u = 0; u < TJ; ++u) out[u] = 0.0f;
#pragma unroll
  for (int m = 0; m < E; m += 4) {
    const float4 v = *reinterpret_cast<const float4*>(y + m);
#pragma unroll
    for (int u = 0; u < TJ; ++u) {
      out[u] = CmAdd(out[u], CmMul(v.x, x[u][m]));
      out[u] = CmAdd(out[u], CmMul(v.y, x[u][m + 1]));
      out[u] = CmAdd(out[u], CmMul(v.z, x[u][m + 2]));
      out[u] = CmAdd(out[u], CmMul(v.w, x[u][m + 3]));
    }
  }
}

/// Lane partial of CmDot of two register vectors.
template <int E>
__device__ __forceinline__ float LanePartialRegs(const float (&x)[E], const float (&y)[E]) {
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < E; ++m) acc = CmAdd(acc, CmMul(x[m], y[m]));
  return acc;
}

/// CmDot's final tree over the 8 lanes of each token group; every lane gets the result.
/// All 32 threads of the warp must call it together.
__device__ __forceinline__ float ReduceLanes(float v) {
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 1 << kLaneShift));
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 2 << kLaneShift));
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 4 << kLaneShift));
  return v;
}

/// Row (0..7) whose complete dot product Butterfly8 leaves in lane `lane`: bit-reversed lane.
__host__ __device__ __forceinline__ int ButterflyRow(int lane) {
  return ((lane & 1) << 2) | (lane & 2) | ((lane >> 2) & 1);
}

/// Transposing reduction of 8 rows' lane partials acc[0..8) held by the 8 lanes of a token
/// group: lane `lane` returns the complete CmDot of row ButterflyRow(lane). Each step adds
/// partner lanes (canonical lane xor 1, then xor 2, then xor 4): CmDot's tree. All 32
/// threads must call it.
__device__ __forceinline__ float Butterfly8(const float (&acc)[8], int lane) {
  float a4[4];
  const bool b0 = lane & 1;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float keep = b0 ? acc[k + 4] : acc[k];
    const float send = b0 ? acc[k] : acc[k + 4];
    a4[k] = CmAdd(keep, __shfl_xor_sync(0xffffffffu, send, 1 << kLaneShift));
  }
  float a2[2];
  const bool b1 = lane & 2;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float keep = b1 ? a4[k + 2] : a4[k];
    const float send = b1 ? a4[k] : a4[k + 2];
    a2[k] = CmAdd(keep, __shfl_xor_sync(0xffffffffu, send, 2 << kLaneShift));
  }
  const bool b2 = lane & 4;
  const float keep = b2 ? a2[1] : a2[0];
  const float send = b2 ? a2[0] : a2[1];
  return CmAdd(keep, __shfl_xor_sync(0xffffffffu, send, 4 << kLaneShift));
}

/// Tokens row t of a layer with n tokens and w window rows sees: clamp(n - w + t + 1, 0, n).
__host__ __device__ __forceinline__ int64_t VisibleCount(int64_t n, int64_t w, int64_t t) {
  const int64_t v = n - w + t + 1;
  return v < 0 ? 0 : (v > n ? n : v);
}

}  // namespace kvtrim::gpu::attn
