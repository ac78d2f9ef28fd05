// The quadratic-form kernels (kernels/gpu/kernels/fast_quad.cuh) against each other: on
// compute capability 9.0 the wgmma kernel and the mma.sync kernel read the same f16 operands
// and differ only in the order of fp32 sums.
//   * FastQuadKernels.WgmmaMatchesMmaSync: bf16 / f16 / f32 x d in {64, 128} x prefix counts
//     {1, 7, 99, 300, 1000} x Gram / Expected Attention, H_kv = 2, 3 matrices per KV head:
//     |wgmma - mma.sync| <= 2^-14 of sum_ic |x_i M_ic x_c| (EA: plus |scale| sum |mu_i x_i|),
//     on the squared outputs for the Gram forms (sqrt(max(0, q))), rows at or past the count
//     untouched; skipped off Hopper;
//   * FastQuadTiming.WgmmaAgainstMmaSync: both at n = 128K, H_kv = 8, 4 matrices per KV head,
//     d = 128, bf16, Gram (median of 10 launches after 3 warm-ups, with the rate in TFLOP/s).
// The scores of the scorers built on them are checked against exact mode in
// fast_model_test.cc. Skips without a GPU.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "base/dtype.h"
#include "kernels/gpu/kernels/fast_quad.cuh"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

#define KVTRIM_QUAD_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

/// Device copies of one case: x [H_kv, n, d] in dtype, planes [mats][2][DP][DP], mat_inv,
/// mean [mats][DP], out [mats, n] (prefilled with a sentinel).
struct QuadDevice {
  DeviceBuffer x, planes, mat_inv, mean, out;

  /// Allocates every buffer with its size in bytes; false on a failure.
  bool Allocate(size_t x_bytes, size_t planes_bytes, size_t mats, size_t dp, size_t out_floats) {
    return x.Allocate(x_bytes) && planes.Allocate(planes_bytes) &&
           mat_inv.Allocate(mats * sizeof(float)) && mean.Allocate(mats * dp * sizeof(float)) &&
           out.Allocate(out_floats * sizeof(float));
  }
  /// The launch arguments over these buffers (EA's scale and half_scale2 left 0).
  QuadFastArgs Args(int64_t n, int64_t count, int32_t d, int32_t mats_per_kv) const {
    QuadFastArgs a{};
    a.x = x.get();
    a.planes = planes.as<__half>();
    a.mat_inv = mat_inv.as<float>();
    a.mean = mean.as<float>();
    a.n = n;
    a.count = count;
    a.d = d;
    a.mats_per_kv = mats_per_kv;
    a.out = out.as<float>();
    return a;
  }
};

constexpr float kSentinel = -4321.0f;
constexpr int32_t kKvHeads = 2, kMatsPerKv = 3;

/// One case's host inputs and the bound of each output's rounding.
struct QuadCase {
  DType dtype = DType::kBF16;
  int32_t d = 128, dp = 128;
  int64_t n = 0, count = 0;
  bool ea = false;
  float scale = 0.125f, half_scale2 = 0.0078125f;
  std::vector<uint8_t> x_raw;        // [H_kv, n, d] dtype
  std::vector<float> x;              // the same values
  std::vector<uint16_t> planes;      // [mats][2][DP][DP] f16 bits
  std::vector<float> mat_inv, mean;  // [mats], [mats][DP]
  std::vector<double> bound;         // [mats, n]
};

/// Random rows (x ~ N(0, 1)), matrices (hi ~ N(0, 1) in f16, lo = hi * 2^-12 rounded), means.
QuadCase MakeCase(DType dtype, int32_t d, int64_t count, bool ea, uint32_t seed) {
  QuadCase c;
  c.dtype = dtype;
  c.d = d;
  c.dp = d <= 64 ? 64 : 128;
  c.count = count;
  c.n = count + 5;
  c.ea = ea;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t elems = static_cast<size_t>(kKvHeads) * c.n * d;
  const size_t width = dtype == DType::kF32 ? 4 : 2;
  c.x.resize(elems);
  c.x_raw.resize(elems * width);
  for (size_t i = 0; i < elems; ++i) {
    const float v = normal(rng);
    if (dtype == DType::kF32) {
      c.x[i] = v;
      std::memcpy(c.x_raw.data() + 4 * i, &v, 4);
    } else {
      const uint16_t bits = dtype == DType::kF16 ? FloatToF16(v) : FloatToBf16(v);
      c.x[i] = dtype == DType::kF16 ? F16ToFloat(bits) : Bf16ToFloat(bits);
      std::memcpy(c.x_raw.data() + 2 * i, &bits, 2);
    }
  }
  const int32_t mats = kKvHeads * kMatsPerKv;
  const size_t plane = static_cast<size_t>(c.dp) * c.dp;
  c.planes.assign(static_cast<size_t>(mats) * 2 * plane, 0);
  c.mat_inv.assign(static_cast<size_t>(mats), 1.0f / 64.0f);
  c.mean.assign(static_cast<size_t>(mats) * c.dp, 0.0f);
  std::vector<double> m(static_cast<size_t>(mats) * plane, 0.0);
  for (int32_t k = 0; k < mats; ++k) {
    for (int32_t r = 0; r < d; ++r) {
      for (int32_t col = 0; col < d; ++col) {
        const uint16_t hi = FloatToF16(normal(rng));
        const uint16_t lo = FloatToF16(F16ToFloat(hi) * (1.0f / 4096.0f));
        const size_t at = static_cast<size_t>(k) * 2 * plane + static_cast<size_t>(r) * c.dp + col;
        c.planes[at] = hi;
        c.planes[at + plane] = lo;
        m[static_cast<size_t>(k) * plane + static_cast<size_t>(r) * c.dp + col] =
            static_cast<double>(F16ToFloat(hi)) + F16ToFloat(lo);
      }
      c.mean[static_cast<size_t>(k) * c.dp + r] = normal(rng);
    }
  }
  c.bound.assign(static_cast<size_t>(mats) * c.n, 0.0);
  for (int32_t k = 0; k < mats; ++k) {
    const int32_t h = k / kMatsPerKv;
    for (int64_t j = 0; j < count; ++j) {
      const float* xj = c.x.data() + (static_cast<size_t>(h) * c.n + j) * d;
      double quad = 0, lin = 0;
      for (int32_t r = 0; r < d; ++r) {
        lin += std::fabs(static_cast<double>(xj[r]) * c.mean[static_cast<size_t>(k) * c.dp + r]);
        for (int32_t col = 0; col < d; ++col) {
          const double mrc =
              m[static_cast<size_t>(k) * plane + static_cast<size_t>(r) * c.dp + col];
          quad += std::fabs(xj[r] * mrc * xj[col]);
        }
      }
      quad *= c.mat_inv[static_cast<size_t>(k)];
      c.bound[static_cast<size_t>(k) * c.n + j] =
          ea ? std::fabs(c.scale) * lin + std::fabs(c.half_scale2) * quad : quad;
    }
  }
  return c;
}

/// Runs `kernel` on `c`; the output [mats, n].
std::vector<float> RunQuad(const QuadCase& c, MmaKernel kernel, cudaError_t* status) {
  const int32_t mats = kKvHeads * kMatsPerKv;
  std::vector<float> out(static_cast<size_t>(mats) * c.n, kSentinel);
  QuadDevice dev;
  auto ok = [&](cudaError_t e) {
    if (*status == cudaSuccess) *status = e;
    return *status == cudaSuccess;
  };
  *status = cudaSuccess;
  if (!dev.Allocate(c.x_raw.size(), c.planes.size() * 2, c.mat_inv.size(),
                    static_cast<size_t>(c.dp), out.size())) {
    *status = cudaErrorMemoryAllocation;
    return out;
  }
  ok(cudaMemcpy(dev.x.get(), c.x_raw.data(), c.x_raw.size(), cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dev.planes.get(), c.planes.data(), c.planes.size() * 2,
                cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dev.mat_inv.get(), c.mat_inv.data(), c.mat_inv.size() * 4,
                cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dev.mean.get(), c.mean.data(), c.mean.size() * 4, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dev.out.get(), out.data(), out.size() * 4, cudaMemcpyHostToDevice));
  QuadFastArgs a = dev.Args(c.n, c.count, c.d, kMatsPerKv);
  a.scale = c.scale;
  a.half_scale2 = c.half_scale2;
  ok(LaunchQuad(a, c.dtype, c.dp, kKvHeads, c.ea, nullptr, kernel));
  ok(cudaDeviceSynchronize());
  ok(cudaMemcpy(out.data(), dev.out.get(), out.size() * 4, cudaMemcpyDeviceToHost));
  return out;
}

const char* DTypeLabel(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kF16 ? "f16" : "bf16");
}

TEST(FastQuadKernels, WgmmaMatchesMmaSync) {
  KVTRIM_SKIP_WITHOUT_GPU();
  if (!WgmmaAvailable()) GTEST_SKIP() << "no wgmma on this device";
  uint32_t seed = 11;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t d : {64, 128}) {
      for (bool ea : {false, true}) {
        for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{300}, int64_t{1000}}) {
          const QuadCase c = MakeCase(dtype, d, count, ea, seed++);
          const std::string label = std::string(DTypeLabel(dtype)) + " d=" + std::to_string(d) +
                                    (ea ? " EA" : " Gram") + " count=" + std::to_string(count);
          cudaError_t status = cudaSuccess;
          const std::vector<float> sync = RunQuad(c, MmaKernel::kMmaSync, &status);
          ASSERT_EQ(status, cudaSuccess) << label;
          const std::vector<float> wg = RunQuad(c, MmaKernel::kWgmma, &status);
          ASSERT_EQ(status, cudaSuccess) << label;
          double worst = 0;
          for (size_t i = 0; i < sync.size(); ++i) {
            const int64_t j = static_cast<int64_t>(i) % c.n;
            if (j >= count) {
              ASSERT_EQ(wg[i], kSentinel) << label << " at " << i;
              continue;
            }
            const double a = ea ? wg[i] : static_cast<double>(wg[i]) * wg[i];
            const double b = ea ? sync[i] : static_cast<double>(sync[i]) * sync[i];
            const double err = std::fabs(a - b) / std::max(c.bound[i], 1e-30);
            worst = std::max(worst, err);
            ASSERT_LE(err, 1.0 / 16384) << label << " at " << i << ": wgmma " << wg[i]
                                        << " mma.sync " << sync[i];
          }
          std::printf("[quad] %s: worst difference %.2e of the bound\n", label.c_str(), worst);
        }
      }
    }
  }
}

TEST(FastQuadTiming, WgmmaAgainstMmaSync) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int32_t kv_heads = 8, mats_per_kv = 4, d = 128;
  const int64_t n = 131072;
  const int32_t mats = kv_heads * mats_per_kv;
  QuadDevice dev;
  ASSERT_TRUE(dev.Allocate(static_cast<size_t>(kv_heads) * n * d * 2,
                           static_cast<size_t>(mats) * 2 * d * d * 2, mats, d,
                           static_cast<size_t>(mats) * n));
  // bf16 1.0 rows, f16 1.0 hi planes, zero lo planes, inverse scales 1: every form is d * d
  // after the row scale 2^14 is undone.
  std::vector<uint16_t> ones(static_cast<size_t>(kv_heads) * n * d, 0x3F80);
  KVTRIM_QUAD_OK(cudaMemcpy(dev.x.get(), ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
  std::vector<uint16_t> planes(static_cast<size_t>(mats) * 2 * d * d, 0);
  for (int32_t k = 0; k < mats; ++k) {
    std::fill_n(planes.begin() + static_cast<size_t>(k) * 2 * d * d, d * d, uint16_t{0x3C00});
  }
  KVTRIM_QUAD_OK(
      cudaMemcpy(dev.planes.get(), planes.data(), planes.size() * 2, cudaMemcpyHostToDevice));
  const std::vector<float> inv(static_cast<size_t>(mats), 1.0f);
  KVTRIM_QUAD_OK(cudaMemcpy(dev.mat_inv.get(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  const QuadFastArgs a = dev.Args(n, n, d, mats_per_kv);
  // Two products (hi, lo) of [n, d] x [d, d] per matrix.
  const double flop = 2.0 * 2.0 * n * mats * d * d;
  std::vector<MmaKernel> kernels = {MmaKernel::kMmaSync};
  if (WgmmaAvailable()) kernels.push_back(MmaKernel::kWgmma);
  for (MmaKernel k : kernels) {
    const char* name = k == MmaKernel::kWgmma ? "wgmma" : "mma.sync";
    const double ms = 1e-3 * MedianLaunchMicros(10, [&] {
      return LaunchQuad(a, DType::kBF16, d, kv_heads, false, nullptr, k);
    });
    std::printf("[timing] quad %s n=%lld mats=%d d=%d bf16: %.3f ms, %.0f TFLOP/s\n", name,
                static_cast<long long>(n), mats, d, ms, flop / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
    RecordProperty(std::string("quad_ms_") + (k == MmaKernel::kWgmma ? "wgmma" : "mma_sync"),
                   std::to_string(ms));
    std::vector<float> host(static_cast<size_t>(mats) * n);
    KVTRIM_QUAD_OK(
        cudaMemcpy(host.data(), dev.out.get(), host.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < host.size(); i += 997) {
      ASSERT_EQ(host[i], static_cast<float>(d)) << name << " at " << i;  // sqrt(d * d)
    }
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing
