// CriticalKV's fast l1 norms kernel by kernel (kernels/gpu/kernels/fast_l1.cuh): the mma.sync
// kernel and, on compute capability 9.0, the wgmma kernel against a double-precision host
// reference of the same f16 operands and against each other:
//   * FastL1Kernels.MatchTheHostReference: f32 / f16 / bf16 x d in {64, 128} x prefix counts
//     {1, 7, 99, 300, 1000} x hidden D in {64, 520, 4096} (a partial W_O chunk, an odd chunk
//     count, a real o_proj), G = 4: |fast - ref| <= 2^-13 * sum_e sum_i |v_i W_ie| (fp32
//     sums of exact f16 products; the f32 inputs' hi + lo split adds 2^-22), rows at or past
//     the prefix count untouched, both kernels within the same bound of each other;
//   * FastL1Kernels.WgmmaRefusedOffHopper: kWgmma is refused where it cannot run;
//   * FastL1Timing.WgmmaAgainstMmaSync: both kernels at n = 32K, H_kv = 8, G = 4, d = 128,
//     D = 4096, bf16 (median of 10 launches after 3 warm-ups, printed with the rate in TFLOP/s).
// Skips without a GPU.
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
#include "kernels/gpu/kernels/fast_l1.cuh"
#include "kernels/gpu/kernels/fast_model.cuh"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

#define KVTRIM_L1_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

/// One layer's inputs: values [H_kv, n, d] in `dtype` (and their exact float values), W_O
/// [D, H_q d] and its f16 image.
struct L1Case {
  DType dtype = DType::kBF16;
  int32_t kv_heads = 2, group = 4, d = 128, hidden = 64;
  int64_t n = 0, count = 0;
  std::vector<float> values;     // [H_kv, n, d] as the kernel reads them
  std::vector<uint8_t> raw;      // the same in dtype
  std::vector<uint8_t> image;    // FastWoImage
  std::vector<double> reference; // [H_q, n]: ||v W_O^q||_1 from the image's f16 values
  std::vector<double> bound;     // [H_q, n]: sum_e sum_i |v_i W_ie|
};

/// Random inputs (values ~ N(0, 1) with a few large rows, W_O ~ N(0, 0.02)) and the host
/// reference in double over the image's f16 W_O.
L1Case MakeCase(DType dtype, int32_t d, int64_t n, int64_t count, int32_t hidden,
                uint32_t seed) {
  L1Case c;
  c.dtype = dtype;
  c.d = d;
  c.n = n;
  c.count = count;
  c.hidden = hidden;
  const int32_t hq = c.kv_heads * c.group;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t elems = static_cast<size_t>(c.kv_heads) * n * d;
  c.values.resize(elems);
  const size_t width = dtype == DType::kF32 ? 4 : 2;
  c.raw.resize(elems * width);
  for (size_t i = 0; i < elems; ++i) {
    const float scale = (i / d) % 37 == 5 ? 300.0f : 1.0f;
    const float x = normal(rng) * scale;
    if (dtype == DType::kF32) {
      c.values[i] = x;
      std::memcpy(c.raw.data() + 4 * i, &x, 4);
    } else {
      const uint16_t bits = dtype == DType::kF16 ? FloatToF16(x) : FloatToBf16(x);
      c.values[i] = dtype == DType::kF16 ? F16ToFloat(bits) : Bf16ToFloat(bits);
      std::memcpy(c.raw.data() + 2 * i, &bits, 2);
    }
  }
  std::vector<float> w_o(static_cast<size_t>(hidden) * hq * d);
  for (float& w : w_o) w = 0.02f * normal(rng);
  c.image = FastWoImage(w_o.data(), hq, d, hidden);
  const FastWoLayout l = MakeFastWoLayout(hq, d, hidden);
  c.reference.assign(static_cast<size_t>(hq) * n, 0.0);
  c.bound.assign(static_cast<size_t>(hq) * n, 0.0);
  for (int32_t q = 0; q < hq; ++q) {
    float inv = 0;
    std::memcpy(&inv, c.image.data() + q * sizeof(float), sizeof inv);
    const uint8_t* rows = c.image.data() + l.header_bytes +
                          static_cast<size_t>(q) * hidden * l.padded_dim * sizeof(uint16_t);
    std::vector<double> w(static_cast<size_t>(hidden) * d);
    for (int32_t e = 0; e < hidden; ++e) {
      for (int32_t i = 0; i < d; ++i) {
        uint16_t bits = 0;
        std::memcpy(&bits, rows + (static_cast<size_t>(e) * l.padded_dim + i) * 2, 2);
        w[static_cast<size_t>(e) * d + i] = static_cast<double>(F16ToFloat(bits)) * inv;
      }
    }
    const int32_t h = q / c.group;
    for (int64_t j = 0; j < count; ++j) {
      const float* v = c.values.data() + (static_cast<size_t>(h) * n + j) * d;
      double sum = 0, abs_sum = 0;
      for (int32_t e = 0; e < hidden; ++e) {
        double dot = 0;
        for (int32_t i = 0; i < d; ++i) {
          const double p = static_cast<double>(v[i]) * w[static_cast<size_t>(e) * d + i];
          dot += p;
          abs_sum += std::fabs(p);
        }
        sum += std::fabs(dot);
      }
      c.reference[static_cast<size_t>(q) * n + j] = sum;
      c.bound[static_cast<size_t>(q) * n + j] = abs_sum;
    }
  }
  return c;
}

/// Device copies of a case's inputs and an output [H_q, n] prefilled with a sentinel.
struct L1Device {
  explicit L1Device(const L1Case& c)
      : values(c.raw.size()),
        image(c.image.size()),
        out(static_cast<size_t>(c.kv_heads) * c.group * c.n * sizeof(float)) {}
  DeviceBuffer values, image, out;
};

constexpr float kSentinel = -12345.0f;

/// Runs `kernel` on `c` and returns the output [H_q, n].
std::vector<float> RunL1(const L1Case& c, MmaKernel kernel, cudaError_t* status) {
  const int32_t hq = c.kv_heads * c.group;
  L1Device dev(c);
  std::vector<float> out(static_cast<size_t>(hq) * c.n, kSentinel);
  if (!dev.values.ok() || !dev.image.ok() || !dev.out.ok()) {
    *status = cudaErrorMemoryAllocation;
    return out;
  }
  cudaMemcpy(dev.values.get(), c.raw.data(), c.raw.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dev.image.get(), c.image.data(), c.image.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dev.out.get(), out.data(), out.size() * sizeof(float), cudaMemcpyHostToDevice);
  const FastWoLayout l = MakeFastWoLayout(hq, c.d, c.hidden);
  L1FastArgs a{};
  a.values = dev.values.get();
  a.w16 = reinterpret_cast<const __half*>(static_cast<const char*>(dev.image.get()) +
                                          l.header_bytes);
  a.w_inv = static_cast<const float*>(dev.image.get());
  a.n = c.n;
  a.count = c.count;
  a.d = c.d;
  a.hidden = c.hidden;
  a.group = c.group;
  a.out = static_cast<float*>(dev.out.get());
  *status = LaunchL1(a, c.dtype, l.padded_dim, c.kv_heads, nullptr, kernel);
  if (*status == cudaSuccess) *status = cudaDeviceSynchronize();
  if (*status == cudaSuccess) {
    *status = cudaMemcpy(out.data(), dev.out.get(), out.size() * sizeof(float),
                         cudaMemcpyDeviceToHost);
  }
  return out;
}

const char* DTypeLabel(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kF16 ? "f16" : "bf16");
}

TEST(FastL1Kernels, MatchTheHostReference) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const bool wgmma = WgmmaAvailable();
  std::printf("[l1] wgmma kernel %s on this device\n", wgmma ? "tested" : "not available");
  uint32_t seed = 7;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t d : {64, 128}) {
      for (int32_t hidden : {64, 520, 4096}) {
        for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{300}, int64_t{1000}}) {
          // The host reference's time: long prefixes only with a short hidden size.
          if ((hidden > 64 && count > 300) || (hidden == 4096 && count == 300)) continue;
          const int64_t n = count + 5;                  // rows past the prefix stay untouched
          const L1Case c = MakeCase(dtype, d, n, count, hidden, seed++);
          const std::string label = std::string(DTypeLabel(dtype)) + " d=" + std::to_string(d) +
                                    " D=" + std::to_string(hidden) +
                                    " count=" + std::to_string(count);
          std::vector<std::vector<float>> outs;
          std::vector<MmaKernel> kernels = {MmaKernel::kMmaSync};
          if (wgmma) kernels.push_back(MmaKernel::kWgmma);
          for (MmaKernel k : kernels) {
            cudaError_t status = cudaSuccess;
            outs.push_back(RunL1(c, k, &status));
            ASSERT_EQ(status, cudaSuccess) << label;
          }
          double worst = 0;
          for (size_t k = 0; k < outs.size(); ++k) {
            const char* name = k == 0 ? "mma.sync" : "wgmma";
            for (int64_t q = 0; q < c.kv_heads * c.group; ++q) {
              for (int64_t j = 0; j < n; ++j) {
                const size_t at = static_cast<size_t>(q * n + j);
                const float got = outs[k][at];
                if (j >= count) {
                  ASSERT_EQ(got, kSentinel) << label << " " << name << " q=" << q << " j=" << j;
                  continue;
                }
                const double err = std::fabs(got - c.reference[at]) / c.bound[at];
                worst = std::max(worst, err);
                ASSERT_LE(err, 1.0 / 8192) << label << " " << name << " q=" << q << " j=" << j
                                           << " got " << got << " want " << c.reference[at];
                if (k > 0) {
                  ASSERT_LE(std::fabs(got - outs[0][at]) / c.bound[at], 1.0 / 8192)
                      << label << " q=" << q << " j=" << j;
                }
              }
            }
          }
          std::printf("[l1] %s: worst error %.2e of sum |v_i W_ie|\n", label.c_str(), worst);
        }
      }
    }
  }
}

TEST(FastL1Kernels, WgmmaRefusedOffHopper) {
  KVTRIM_SKIP_WITHOUT_GPU();
  if (WgmmaAvailable()) GTEST_SKIP() << "compute capability 9.0: wgmma runs here";
  const L1Case c = MakeCase(DType::kBF16, 128, 16, 16, 64, 3);
  cudaError_t status = cudaSuccess;
  RunL1(c, MmaKernel::kWgmma, &status);
  EXPECT_EQ(status, cudaErrorInvalidValue);
}

TEST(FastL1Timing, WgmmaAgainstMmaSync) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int32_t kv_heads = 8, group = 4, d = 128, hidden = 4096;
  const int64_t n = 32768;
  const int32_t hq = kv_heads * group;
  DeviceBuffer values(static_cast<size_t>(kv_heads) * n * d * 2);
  const FastWoLayout l = MakeFastWoLayout(hq, d, hidden);
  DeviceBuffer image(l.bytes);
  DeviceBuffer out(static_cast<size_t>(hq) * n * sizeof(float));
  ASSERT_TRUE(values.ok() && image.ok() && out.ok());
  // bf16 0x3F80 = 1.0 and f16 0x3C00 = 1.0 everywhere, inverse scales 1: the rate does not
  // depend on the values.
  std::vector<uint16_t> ones(static_cast<size_t>(kv_heads) * n * d, 0x3F80);
  KVTRIM_L1_OK(cudaMemcpy(values.get(), ones.data(), ones.size() * 2, cudaMemcpyHostToDevice));
  std::vector<uint8_t> img(l.bytes, 0);
  for (int32_t q = 0; q < hq; ++q) {
    const float one = 1.0f;
    std::memcpy(img.data() + q * sizeof(float), &one, sizeof one);
  }
  for (size_t i = l.header_bytes; i + 1 < l.bytes; i += 2) {
    img[i] = 0x00;
    img[i + 1] = 0x3C;
  }
  KVTRIM_L1_OK(cudaMemcpy(image.get(), img.data(), img.size(), cudaMemcpyHostToDevice));
  L1FastArgs a{};
  a.values = values.get();
  a.w16 = reinterpret_cast<const __half*>(static_cast<const char*>(image.get()) + l.header_bytes);
  a.w_inv = static_cast<const float*>(image.get());
  a.n = n;
  a.count = n;
  a.d = d;
  a.hidden = hidden;
  a.group = group;
  a.out = static_cast<float*>(out.get());
  const double flop = 2.0 * n * hq * d * hidden;
  std::vector<MmaKernel> kernels = {MmaKernel::kMmaSync};
  if (WgmmaAvailable()) kernels.push_back(MmaKernel::kWgmma);
  for (MmaKernel k : kernels) {
    const double ms = 1e-3 * MedianLaunchMicros(10, [&] {
      return LaunchL1(a, DType::kBF16, l.padded_dim, kv_heads, nullptr, k);
    });
    const char* name = k == MmaKernel::kWgmma ? "wgmma" : "mma.sync";
    std::printf("[timing] l1 %s n=%lld H_q=%d d=%d D=%d bf16: %.3f ms, %.0f TFLOP/s\n", name,
                static_cast<long long>(n), hq, d, hidden, ms, flop / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
    RecordProperty(std::string("l1_ms_") + (k == MmaKernel::kWgmma ? "wgmma" : "mma_sync"),
                   std::to_string(ms));
    // Every output: D * d for all-ones operands.
    std::vector<float> host(static_cast<size_t>(hq) * n);
    KVTRIM_L1_OK(cudaMemcpy(host.data(), out.get(), host.size() * sizeof(float),
                            cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < host.size(); i += 997) {
      ASSERT_EQ(host[i], static_cast<float>(hidden * d)) << name << " at " << i;
    }
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing
