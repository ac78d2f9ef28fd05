// Tiles shared by the fast model-aware kernels (fast_model.cu, fast_l1.cu): token rows of K
// or V as scaled f16 A fragments, the (KV head, part, sub) work-item order, B fragments
// from padded shared-memory rows and the mma.sync tile products (fast_mma.cuh), and the
// launch helper of the 8-warp tiled kernels. See fast_model.cu for the scaling and its
// error bounds.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/canonical_math.h"
#include "kernels/gpu/kernels/fast_mma.cuh"

namespace kvtrim::gpu::fast_tiles {

using fast::CpAsync16;
using fast::CpAsyncCommit;
using fast::CpAsyncWait;
using fast::LdMatrixX4;
using fast::SmemAddress;

constexpr int kThreads = 256;  // 8 warps in every tiled kernel
constexpr int kWarps = kThreads / 32;

/// The exponent k that takes `max_abs` into [2^14, 2^15) by 2^k: 14 - floor(log2(max_abs)),
/// clamped to [-126, 126]; 0 for zero, inf or NaN (the row then converts as it is).
__host__ __device__ inline int ScaleExponent(float max_abs) {
  if (!(max_abs > 0.0f) || max_abs > 3.4028235e38f) return 0;
  int e = 0;
  frexpf(max_abs, &e);  // max_abs = f 2^e, f in [0.5, 1): floor(log2) = e - 1
  const int k = 15 - e;
  return k < -126 ? -126 : (k > 126 ? 126 : k);
}

/// Sets every accumulator of an [A][B][4] fragment array to zero.
template <int A, int B>
__device__ __forceinline__ void ZeroAccumulators(float (&acc)[A][B][4]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// ---- Token rows -> A fragments ----------------------------------------------------------------

/// The raw bits of two consecutive elements of T: one 32-bit word for f16 / bf16, float2 for f32.
template <typename T>
using RawPair = typename std::conditional<std::is_same<T, float>::value, float2, uint32_t>::type;

/// A raw pair as two floats (exact).
__device__ __forceinline__ float2 PairToFloat2(float2 r, float) { return r; }
__device__ __forceinline__ float2 PairToFloat2(uint32_t r, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&r));
}
__device__ __forceinline__ float2 PairToFloat2(uint32_t r, __nv_bfloat16) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
}

/// Two f16 values of a register as floats (the lower 16 bits first).
__device__ __forceinline__ float2 HalfPair(uint32_t r) {
  return __half22float2(*reinterpret_cast<const __half2*>(&r));
}

/// Loads the A fragments of MT row tiles (16 token rows each; tile m starts at row0 +
/// m_stride m) of a KV head's [n, d] rows `head`, scaled per row (see the file comment) and
/// rounded to f16:
/// a[0] the f16 values (f32 inputs: hi), a[1] the f32 inputs' lo parts (PL = 2). Rows
/// >= count and columns >= d are zero. inv[m][hf] = 2^-k of row 16m + g + 8hf (lane =
/// 4g + t). A fragment register r of k-step kc holds row g + 8 (r & 1), columns
/// 16 kc + 8 (r >> 1) + 2t, + 1. All 32 lanes call it. Every load is issued before the
/// first is used (raw pairs: as many registers as the fragments for 16-bit inputs).
template <typename T, int DP, int MT, int PL>
__device__ __forceinline__ void LoadTokenFragments(const T* __restrict__ head, int64_t row0,
                                                   int64_t count, int d, int lane,
                                                   uint32_t (&a)[PL][MT][DP / 16][4],
                                                   float (&inv)[MT][2], int64_t m_stride = 16) {
  using Raw = RawPair<T>;
  constexpr int KC = DP / 16;
  const int g = lane >> 2;
  const int t = lane & 3;
  Raw raw[MT][2][KC][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t j = row0 + m_stride * m + g + 8 * hf;
      const bool valid = j < count;
      const T* row = head + (valid ? j : 0) * static_cast<int64_t>(d);
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int col = 16 * kc + 8 * h2 + 2 * t;
          raw[m][hf][kc][h2] =
              (valid && col < d) ? *reinterpret_cast<const Raw*>(row + col) : Raw{};
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const float2 x = PairToFloat2(raw[m][hf][kc][h2], T());
          mx = fmaxf(mx, fmaxf(fabsf(x.x), fabsf(x.y)));
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const int k = ScaleExponent(mx);
      const float s = CmPow2(k);
      inv[m][hf] = CmPow2(-k);
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const float2 x = PairToFloat2(raw[m][hf][kc][h2], T());
          const float x0 = x.x * s;
          const float x1 = x.y * s;
          if constexpr (PL == 1) {
            a[0][m][kc][2 * h2 + hf] = fast::PackPair<__half>(x0, x1);
          } else {
            fast::SplitPair<__half>(x0, x1, &a[0][m][kc][2 * h2 + hf],
                                    &a[PL - 1][m][kc][2 * h2 + hf]);
          }
        }
      }
    }
  }
}

/// The work item of a CTA of a 1-D grid ordered (KV head h, part, sub), sub fastest: the CTAs
/// of one KV head (and of one part) run together and share its rows and matrices in L2.
struct WorkItem {
  int h;         // KV head
  int64_t part;  // token tile or tile group
  int sub;       // query head / matrix of the KV head
};

/// Decodes blockIdx.x for `parts` parts of `subs` items per KV head.
__device__ __forceinline__ WorkItem CurrentWorkItem(int64_t parts, int subs) {
  const int64_t b = blockIdx.x;
  const int64_t per_head = parts * subs;
  const int64_t rem = b % per_head;
  return {static_cast<int>(b / per_head), rem / subs, static_cast<int>(rem % subs)};
}

/// Sums a per-row value over the four lanes t that share it (fixed order); every lane gets it.
__device__ __forceinline__ float SumOverQuad(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

/// B fragments of two n8 tiles (rows r0 .. r0 + 15 of a row-major [rows][stride] f16 tile,
/// columns 16 kc .. 16 kc + 15): {b0, b1} of rows r0.. in r[0], r[1], of rows r0 + 8.. in
/// r[2], r[3].
template <int kStride>
__device__ __forceinline__ void LoadBPair(const __half* base, int r0, int kc, int lane,
                                          uint32_t (&r)[4]) {
  const int row = r0 + (lane >> 4) * 8 + (lane & 7);
  LdMatrixX4(r, SmemAddress(base + row * kStride + 16 * kc + ((lane >> 3) & 1) * 8));
}

/// acc[m][nt] += A(row tile m, k-step kc) x B(n8 tile nt) for MT row tiles and NT n8 tiles:
/// B tile nt = rows r0 + 8 nt .. + 7, columns 16 kc .. + 15 of the row-major f16 tile `b` in
/// shared memory (one row per output column); A = the sum of planes 0 .. kPlanes - 1 of `af`.
template <int kStride, int kPlanes, int MT, int NT, int PL, int KC>
__device__ __forceinline__ void AddTileProducts(float (&acc)[MT][NT][4],
                                                const uint32_t (&af)[PL][MT][KC][4],
                                                const __half* b, int r0, int kc, int lane) {
  static_assert(kPlanes <= PL && NT % 2 == 0, "planes of A; n8 tiles in pairs");
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t bf[4];
    LoadBPair<kStride>(b, r0 + 16 * np, kc, lane, bf);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int pl = 0; pl < kPlanes; ++pl) {
        fast::Mma16816<__half>(acc[m][2 * np], af[pl][m][kc], bf[0], bf[1]);
        fast::Mma16816<__half>(acc[m][2 * np + 1], af[pl][m][kc], bf[2], bf[3]);
      }
    }
  }
}

/// Opts `kernel` into `smem` bytes of dynamic shared memory and launches it on a 1-D grid of
/// `threads`-thread CTAs.
template <typename Kernel, typename Args>
cudaError_t LaunchWithSmem(Kernel kernel, int64_t blocks, size_t smem, const Args& args,
                           cudaStream_t stream, int threads = kThreads) {
  if (blocks < 1) return cudaSuccess;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu::fast_tiles
