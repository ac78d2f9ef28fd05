// Canonical fp32 arithmetic shared by the CPU and GPU backends.
//
// The GPU backend must reproduce the CPU backend's kept indices exactly for fp32 inputs,
// so both backends compute every score with the same sequence of IEEE-754 operations:
// only correctly rounded add, mul, div and sqrt (never fused multiply-add), a software exp
// built from them, dot products in a fixed 8-lane order, and sums over tokens in fixed
// chunks of kCanonicalChunk tokens combined by a fixed pairwise tree. Every function here
// compiles for host and device and gives the same bits on both.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define KVTRIM_HD __host__ __device__ __forceinline__
#define KVTRIM_UNROLL _Pragma("unroll")
#else
#define KVTRIM_HD inline
#define KVTRIM_UNROLL
#endif

namespace kvtrim {

/// Tokens per chunk of a canonical sum over tokens.
constexpr int64_t kCanonicalChunk = 64;

/// Lanes of a canonical dot product.
constexpr int kCanonicalLanes = 8;

/// a + b, correctly rounded, never fused.
KVTRIM_HD float CmAdd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;  // kvtrim_kernels builds with -ffp-contract=off: never fused
#endif
}

/// a * b, correctly rounded, never fused.
KVTRIM_HD float CmMul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a / b, correctly rounded.
KVTRIM_HD float CmDiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// sqrt(a), correctly rounded.
KVTRIM_HD float CmSqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

/// 2^e as a float for e in [-126, 127], built from its bits (exact).
KVTRIM_HD float CmPow2(int e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

/// rint(x) (round half to even) for |x| < 2^22 by the 1.5*2^23 trick, exact on both sides.
KVTRIM_HD float CmRint(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return CmAdd(CmAdd(x, magic), -magic);
}

/// exp(x) from canonical operations only (relative error < 2 ulp). exp(-inf) = 0; results
/// below e^-87 flush to 0 (no subnormals); x > 88.7 gives +inf.
KVTRIM_HD float CmExp(float x) {
  if (!(x >= -87.0f)) return 0.0f;  // also -inf
  if (x > 88.72f) return INFINITY;
  const float n = CmRint(CmMul(x, 1.44269504088896341f));
  const float r = CmAdd(CmAdd(x, -CmMul(n, 0.693145751953125f)), -CmMul(n, 1.428606765330187e-06f));
  float p = 2.4801587e-05f;                 // 1/8!
  p = CmAdd(CmMul(p, r), 1.9841270e-04f);   // 1/7!
  p = CmAdd(CmMul(p, r), 1.3888889e-03f);   // 1/6!
  p = CmAdd(CmMul(p, r), 8.3333333e-03f);   // 1/5!
  p = CmAdd(CmMul(p, r), 4.1666667e-02f);   // 1/4!
  p = CmAdd(CmMul(p, r), 1.6666667e-01f);   // 1/3!
  p = CmAdd(CmMul(p, r), 0.5f);
  p = CmAdd(CmMul(p, r), 1.0f);
  p = CmAdd(CmMul(p, r), 1.0f);
  // p * 2^n in two exact power-of-two steps (n in [-126, 128]; the result is normal).
  const int e = static_cast<int>(n);
  const int e1 = e / 2;
  return CmMul(CmMul(p, CmPow2(e1)), CmPow2(e - e1));
}

/// Canonical dot product of a[0..d) and b[0..d): lane l sums a[i]*b[i] for i = l (mod 8)
/// in increasing i, then ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
KVTRIM_HD float CmDot(const float* a, const float* b, int d) {
  float lane[kCanonicalLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + kCanonicalLanes <= d; i += kCanonicalLanes) {
    KVTRIM_UNROLL
    for (int l = 0; l < kCanonicalLanes; ++l) lane[l] = CmAdd(lane[l], CmMul(a[i + l], b[i + l]));
  }
  for (int l = 0; i + l < d; ++l) lane[l] = CmAdd(lane[l], CmMul(a[i + l], b[i + l]));
  return CmAdd(CmAdd(CmAdd(lane[0], lane[1]), CmAdd(lane[2], lane[3])),
               CmAdd(CmAdd(lane[4], lane[5]), CmAdd(lane[6], lane[7])));
}

/// Canonical pairwise tree sum of x[0..m) in place (x is clobbered): each level replaces
/// x[i] by x[2i] + x[2i+1], an odd tail moving up unchanged, until one value remains.
/// Returns 0 for m == 0.
KVTRIM_HD float CmTreeSum(float* x, int64_t m) {
  if (m <= 0) return 0.0f;
  while (m > 1) {
    const int64_t half = m / 2;
    for (int64_t i = 0; i < half; ++i) x[i] = CmAdd(x[2 * i], x[2 * i + 1]);
    if (m % 2) x[half] = x[m - 1];
    m = half + (m % 2);
  }
  return x[0];
}

/// Canonical long sum of x[0..m): z_c = left-to-right CmAdd chain (from +0.0f) over each
/// chunk of kCanonicalChunk consecutive values, then CmTreeSum over the chunk sums in order.
/// `chunks` is scratch of at least ceil(m / kCanonicalChunk) floats. Returns 0 for m == 0.
KVTRIM_HD float CmChunkedSum(const float* x, int64_t m, float* chunks) {
  int64_t c = 0;
  for (int64_t start = 0; start < m; start += kCanonicalChunk, ++c) {
    float z = 0.0f;
    const int64_t end = start + kCanonicalChunk < m ? start + kCanonicalChunk : m;
    for (int64_t i = start; i < end; ++i) z = CmAdd(z, x[i]);
    chunks[c] = z;
  }
  return CmTreeSum(chunks, c);
}

}  // namespace kvtrim
