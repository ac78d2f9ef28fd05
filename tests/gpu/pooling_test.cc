// The GPU pooling kernels (kernels/gpu/kernels/pooling.cuh) bit for bit against the CPU's
// Pool1D and PoolPrefix (kernels/cpu/pooling.h):
//   * PoolingParity.PoolPrefixEqualsCpu: rows of n in {1, 7, 99, 1030, 40000, 131077} x
//     kernels {1, 7, 31, 601} (601: wider than the tiled kernel's margin) x max / avg x
//     prefix in {0, n / 2, n - 8, n} (a prefix past one CTA's share: the window fill's
//     cluster of CTAs), 3 rows, random scores with runs of ties;
//   * PoolingParity.FirstMaxTiesAcrossCtas: -0 before +0 in different CTAs' parts of the prefix:
//     the window takes -0 (the first maximum), as FirstMax;
//   * PoolingParity.Pool1DEqualsCpu: LaunchPool1D over the same shapes.
// Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/pooling.h"
#include "kernels/gpu/kernels/pooling.cuh"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr int32_t kRows = 3;

/// Random scores in [0, 1) with a run of equal values every 97 entries.
std::vector<float> Scores(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kRows * n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 13) % 97 == 3 ? 0.75f : u(rng);
  return x;
}

/// Runs `launch(in, out)` on device copies of `in` and returns out [kRows, n].
template <typename Launch>
std::vector<float> RunOnDevice(const std::vector<float>& in, Launch launch, cudaError_t* status) {
  std::vector<float> out(in.size(), -7.0f);
  const size_t bytes = in.size() * sizeof(float);
  const DeviceBuffer d_in(bytes), d_out(bytes);
  if (!d_in.ok() || !d_out.ok()) {
    *status = cudaErrorMemoryAllocation;
    return out;
  }
  *status = cudaMemcpy(d_in.get(), in.data(), bytes, cudaMemcpyHostToDevice);
  if (*status == cudaSuccess) {
    *status = cudaMemcpy(d_out.get(), out.data(), bytes, cudaMemcpyHostToDevice);
  }
  if (*status == cudaSuccess) *status = launch(d_in.as<float>(), d_out.as<float>());
  if (*status == cudaSuccess) *status = cudaDeviceSynchronize();
  if (*status == cudaSuccess) {
    *status = cudaMemcpy(out.data(), d_out.get(), bytes, cudaMemcpyDeviceToHost);
  }
  return out;
}

/// Bitwise equality of two rows, naming the first difference.
void ExpectSameBits(const std::vector<float>& want, const std::vector<float>& got,
                    const std::string& label) {
  ASSERT_EQ(want.size(), got.size()) << label;
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, &got[i], 4);
    ASSERT_EQ(a, b) << label << " at " << i << ": want " << want[i] << " got " << got[i];
  }
}

const std::vector<int64_t>& Lengths() {
  static const std::vector<int64_t> n = {1, 7, 99, 1030, 40000, 131077};
  return n;
}

TEST(PoolingParity, PoolPrefixEqualsCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (int64_t n : Lengths()) {
    const std::vector<float> in = Scores(n, seed++);
    for (int32_t kernel : {1, 7, 31, 601}) {
      for (bool max_pool : {true, false}) {
        for (int64_t prefix : {int64_t{0}, n / 2, std::max<int64_t>(n - 8, 0), n}) {
          if (kernel == 1 && prefix == n) continue;  // in == out only: not this shape
          const std::string label = "n=" + std::to_string(n) + " kernel=" +
                                    std::to_string(kernel) + (max_pool ? " max" : " avg") +
                                    " prefix=" + std::to_string(prefix);
          std::vector<float> want(in.size());
          for (int32_t r = 0; r < kRows; ++r) {
            PoolPrefix(max_pool ? PoolKind::kMax : PoolKind::kAvg, in.data() + r * n, n, prefix,
                       kernel, want.data() + r * n);
          }
          cudaError_t status = cudaSuccess;
          const std::vector<float> got = RunOnDevice(
              in,
              [&](const float* d_in, float* d_out) {
                return LaunchPoolPrefix(d_in, kRows, n, prefix, kernel, max_pool, d_out, nullptr);
              },
              &status);
          ASSERT_EQ(status, cudaSuccess) << label;
          ExpectSameBits(want, got, label);
        }
      }
    }
  }
}

TEST(PoolingParity, FirstMaxTiesAcrossCtas) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int64_t n = 100000;
  const int64_t prefix = n - 16;  // 7 CTAs per row share the prefix
  std::vector<float> in(static_cast<size_t>(kRows * n), -1.0f);
  for (int32_t r = 0; r < kRows; ++r) {
    in[static_cast<size_t>(r * n + 20000 + r)] = -0.0f;  // the first maximum
    in[static_cast<size_t>(r * n + 90000)] = 0.0f;       // equal, later, another CTA
  }
  std::vector<float> want(in.size());
  for (int32_t r = 0; r < kRows; ++r) {
    PoolPrefix(PoolKind::kMax, in.data() + r * n, n, prefix, 1, want.data() + r * n);
  }
  ASSERT_TRUE(std::signbit(want[static_cast<size_t>(n - 1)]));
  cudaError_t status = cudaSuccess;
  const std::vector<float> got = RunOnDevice(
      in,
      [&](const float* d_in, float* d_out) {
        return LaunchPoolPrefix(d_in, kRows, n, prefix, 1, true, d_out, nullptr);
      },
      &status);
  ASSERT_EQ(status, cudaSuccess);
  ExpectSameBits(want, got, "signed zeros");
}

TEST(PoolingParity, Pool1DEqualsCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  uint32_t seed = 50;
  for (int64_t n : Lengths()) {
    const std::vector<float> in = Scores(n, seed++);
    for (int32_t kernel : {1, 7, 31, 601}) {
      for (bool max_pool : {true, false}) {
        const std::string label = "n=" + std::to_string(n) + " kernel=" + std::to_string(kernel) +
                                  (max_pool ? " max" : " avg");
        std::vector<float> want(in.size());
        for (int32_t r = 0; r < kRows; ++r) {
          Pool1D(max_pool ? PoolKind::kMax : PoolKind::kAvg, in.data() + r * n, n, kernel,
                 want.data() + r * n);
        }
        cudaError_t status = cudaSuccess;
        const std::vector<float> got = RunOnDevice(
            in,
            [&](const float* d_in, float* d_out) {
              return LaunchPool1D(d_in, kRows, n, kernel, max_pool, d_out, nullptr);
            },
            &status);
        ASSERT_EQ(status, cudaSuccess) << label;
        ExpectSameBits(want, got, label);
      }
    }
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing
