// Device building blocks of the model-aware scorers (model_scorers.cu): asynchronous copies
// into shared memory and the register-tiled canonical dot product of TJ x-vectors with TU
// rows, both "lane-major" in shared memory (launchers.h: lane l of a d-vector holds elements
// l, l + 8, ... at [l * E, l * E + E)).
//
// One thread computes all TJ * TU dot products completely (no cross-thread reduction): the 8
// canonical lane chains of CmDot run one after the other and are folded into CmDot's final
// tree ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) as they complete, which takes four
// registers per output (the tree's Sethi-Ullman number). Each 16-byte load of an x-vector
// feeds TU chains and each load of a row feeds TJ chains.
//
// Zero-sign note: a lane chain here starts from its first product instead of CmAdd(+0, p0).
// The two differ only when p0 = -0 and every later term of the chain is a zero, and then only
// in the sign of a zero result; every caller feeds the dot into |.|, max(0, .) or a sum with
// other terms where a zero's sign cannot change a bit of the final score (model_scorers.cu
// says why for each), so the saved add is free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/canonical_math.h"

namespace kvtrim::gpu::model {

/// 16-byte asynchronous copy global -> shared (cp.async.cg, L2 only); copies zeros instead
/// when `valid` is false (`src` must still be a valid address).
__device__ __forceinline__ void CpAsync16(float* dst, const float* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes)
               : "memory");
}

/// Closes the current group of asynchronous copies.
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// out[tj][u] = CmDot(x_tj, w_u, d) for lane-major vectors in shared memory with E floats per
/// lane: x_tj at x + tj * x_stride, w_u at w + u * w_stride (strides in floats, multiples of
/// 4; all addresses 16-byte aligned). Elements past d are zero in both (their products add
/// zeros at the end of a lane chain: only a zero's sign can change, see the file comment).
template <int E, int TJ, int TU>
__device__ __forceinline__ void DotTile(const float* __restrict__ x, int x_stride,
                                        const float* __restrict__ w, int w_stride,
                                        float (&out)[TJ][TU]) {
  static_assert(E % 4 == 0, "lanes are read as float4");
  float a[TJ][TU];     // (l0 + l1) + (l2 + l3)
  float b[TJ][TU];     // l4 + l5
  float even[TJ][TU];  // the chain of the last even lane
#pragma unroll 1
  for (int l = 0; l < 8; ++l) {
    float cur[TJ][TU];
    {  // first quad of the lane: the chain starts from its first product
      float4 xv[TJ];
#pragma unroll
      for (int tj = 0; tj < TJ; ++tj) {
        xv[tj] = *reinterpret_cast<const float4*>(x + tj * x_stride + l * E);
      }
#pragma unroll
      for (int u = 0; u < TU; ++u) {
        const float4 wv = *reinterpret_cast<const float4*>(w + u * w_stride + l * E);
#pragma unroll
        for (int tj = 0; tj < TJ; ++tj) {
          float c = CmMul(xv[tj].x, wv.x);
          c = CmAdd(c, CmMul(xv[tj].y, wv.y));
          c = CmAdd(c, CmMul(xv[tj].z, wv.z));
          cur[tj][u] = CmAdd(c, CmMul(xv[tj].w, wv.w));
        }
      }
    }
#pragma unroll 1
    for (int mb = 4; mb < E; mb += 4) {
      float4 xv[TJ];
#pragma unroll
      for (int tj = 0; tj < TJ; ++tj) {
        xv[tj] = *reinterpret_cast<const float4*>(x + tj * x_stride + l * E + mb);
      }
#pragma unroll
      for (int u = 0; u < TU; ++u) {
        const float4 wv = *reinterpret_cast<const float4*>(w + u * w_stride + l * E + mb);
#pragma unroll
        for (int tj = 0; tj < TJ; ++tj) {
          float c = cur[tj][u];
          c = CmAdd(c, CmMul(xv[tj].x, wv.x));
          c = CmAdd(c, CmMul(xv[tj].y, wv.y));
          c = CmAdd(c, CmMul(xv[tj].z, wv.z));
          cur[tj][u] = CmAdd(c, CmMul(xv[tj].w, wv.w));
        }
      }
    }
    // Fold the finished lane into CmDot's tree (l is uniform: no divergence).
#pragma unroll
    for (int tj = 0; tj < TJ; ++tj) {
#pragma unroll
      for (int u = 0; u < TU; ++u) {
        if ((l & 1) == 0) {
          even[tj][u] = cur[tj][u];
        } else {
          const float s = CmAdd(even[tj][u], cur[tj][u]);
          if (l == 1) {
            a[tj][u] = s;
          } else if (l == 3) {
            a[tj][u] = CmAdd(a[tj][u], s);
          } else if (l == 5) {
            b[tj][u] = s;
          } else {
            out[tj][u] = CmAdd(a[tj][u], CmAdd(b[tj][u], s));
          }
        }
      }
    }
  }
}

/// CmDot's final tree over the 8 canonical lanes held by warp lanes differing in bits 0..2
/// (lane = warp lane & 7); every one of the eight gets the result. All 32 threads call it.
__device__ __forceinline__ float ReduceLaneBits012(float v) {
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 2));
  v = CmAdd(v, __shfl_xor_sync(0xffffffffu, v, 4));
  return v;
}

}  // namespace kvtrim::gpu::model
