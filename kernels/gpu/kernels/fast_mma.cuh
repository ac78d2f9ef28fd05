// Warp-level tensor-core and async-copy building blocks of the fast numerics kernels
// (design.md "Numerics"): ldmatrix, mma.sync m16n8k16 with fp32 accumulate, cp.async with
// zero fill, and the hardware exp2. sm_80+ PTX; the project builds for sm_90a.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"): with g = lane / 4 and t = lane % 4,
//   A (16x16, row):  a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
//                    a3 = A[g+8][2t+8, 2t+9]                     (two 16-bit values per reg)
//   B (16x8, col):   b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C (16x8, fp32):  c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace kvtrim::gpu::fast {

/// Shared-memory address of a generic pointer (for ldmatrix / cp.async).
__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8, and every
/// lane receives element [g][2t, 2t+1] of matrix i in r[i].
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// LdMatrixX4 transposed: r[i] = element [2t, 2t+1][g] of matrix i.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// D = A * B + D for one m16n8k16 tile; CT is __nv_bfloat16 or __half.
template <typename CT>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (sizeof(CT) == 2 && std::is_same<CT, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// 16-byte asynchronous global -> shared copy; `bytes` < 16 zero-fills the rest (0 = all).
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(global),
               "r"(bytes));
}

/// Commits the cp.async issued so far as one group.
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `N` committed cp.async groups are still pending.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Hardware 2^x (MUFU.EX2, about 2 ulp; 2^-inf = +0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Packs two floats into one register of two CT values (round to nearest even); `lo` goes
/// to the lower 16 bits (the lower column / k index of a fragment).
template <typename CT>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same<CT, __half>::value) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

/// Splits two floats into CT pairs hi = CT(x), lo = CT(x - hi): hi + lo carries about twice
/// CT's mantissa (16 bits for bf16, 22 for f16), for products that need more than CT.
template <typename CT>
__device__ __forceinline__ void SplitPair(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  *hi = PackPair<CT>(x0, x1);
  float h0, h1;
  if constexpr (std::is_same<CT, __half>::value) {
    const __half2 v = *reinterpret_cast<const __half2*>(hi);
    h0 = __low2float(v);
    h1 = __high2float(v);
  } else {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(hi);
    h0 = __low2float(v);
    h1 = __high2float(v);
  }
  *lo = PackPair<CT>(x0 - h0, x1 - h1);
}

/// A CT value as float.
__device__ __forceinline__ float AsFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float AsFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

}  // namespace kvtrim::gpu::fast
