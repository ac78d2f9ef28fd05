// Conformance tests of the Random scorer (specs/baselines.md §9) on the CPU and of its
// counter hash (kernels/counter_hash.h): pinned values, the U[0, 1) grid, determinism, and
// independence across seeds, layers and heads. Found through the CPU scorer table.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/counter_hash.h"
#include "kernels/cpu/cpu_layer.h"
#include "tests/testing/cpu_keys_layer.h"

namespace kvtrim {
namespace {

using testing::RandomKeysLayer;
using testing::RunCpuScorer;
using testing::TableScorer;

TEST(CounterHashRandom, SplitMix64MatchesTheReferenceSequence) {
  // The first outputs of the reference splitmix64 generator seeded with 0 are
  // SplitMix64(0), SplitMix64(gamma), ...: pins the exact mixer for CPU/GPU parity.
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(SplitMix64(0x3C6EF372FE94F82Aull), 0x06C45D188009454Full);
}

TEST(CounterHashRandom, PinnedValuesFromAnIndependentPythonModel) {
  // Computed with arbitrary-precision Python from the documented recipe; a change to the
  // folding order or the mixer changes these (and breaks CPU/GPU and run-to-run parity).
  EXPECT_EQ(CounterHash64(42, 3, 5, 17), 0x724142A576B3ECC6ull);
  EXPECT_EQ(CounterHash64(0, 0, 0, 0), 0x2130748AAAC80268ull);
  EXPECT_EQ(CounterHash64(~uint64_t{0}, -1, 7, 123456), 0x275148DF20240024ull);
  EXPECT_EQ(CounterUniform(42, 3, 5, 17), 7487810.0f / 16777216.0f);
  EXPECT_EQ(CounterUniform(0, 0, 0, 0), 2175092.0f / 16777216.0f);
}

TEST(CounterHashRandom, UniformIsAMultipleOfTwoToTheMinus24InUnitInterval) {
  for (int64_t j = 0; j < 20000; ++j) {
    const float u = CounterUniform(42, 3, j % 7, j);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    const float scaled = u * 16777216.0f;
    ASSERT_EQ(scaled, std::floor(scaled)) << "token " << j;
  }
}

TEST(RandomScore, EqualsTheCounterHashOfSeedLayerHeadToken) {
  const CpuLayer layer = RandomKeysLayer(4, 257, 2, 1, /*layer_id=*/5, /*seed=*/0xDEADBEEFull);
  const std::vector<float> s = RunCpuScorer(TableScorer("random"), layer, 3);
  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t j = 0; j < 257; ++j) {
      ASSERT_EQ(s[h * 257 + j], CounterUniform(0xDEADBEEFull, 5, h, j));
    }
  }
}

TEST(RandomScore, DeterministicWhateverTheThreadCount) {
  const CpuLayer layer = RandomKeysLayer(8, 999, 2, 1, 2, 7);
  const std::vector<float> a = RunCpuScorer(TableScorer("random"), layer, 1);
  const std::vector<float> b = RunCpuScorer(TableScorer("random"), layer, 4);
  const std::vector<float> c = RunCpuScorer(TableScorer("random"), layer, 4);
  EXPECT_EQ(a, b);
  EXPECT_EQ(b, c);
}

// Fraction of positions where two score arrays hold the same value.
double EqualFraction(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

TEST(RandomScore, ChangesWithSeedLayerAndHead) {
  const auto run = [](int32_t layer_id, uint64_t seed) {
    return RunCpuScorer(TableScorer("random"), RandomKeysLayer(2, 4096, 1, 1, layer_id, seed), 1);
  };
  const std::vector<float> base = run(3, 11);
  const std::vector<float> other_seed = run(3, 12);
  const std::vector<float> other_layer = run(4, 11);
  EXPECT_LT(EqualFraction(base, other_seed), 0.01);
  EXPECT_LT(EqualFraction(base, other_layer), 0.01);
  // Head 0 vs head 1 of the same layer.
  const std::vector<float> h0(base.begin(), base.begin() + 4096);
  const std::vector<float> h1(base.begin() + 4096, base.end());
  EXPECT_LT(EqualFraction(h0, h1), 0.01);
  // Token j of one head is not token j+1 of another (no shifted copies).
  const std::vector<float> h1_shift(base.begin() + 4097, base.end());
  const std::vector<float> h0_cut(base.begin(), base.begin() + 4095);
  EXPECT_LT(EqualFraction(h0_cut, h1_shift), 0.01);
}

TEST(RandomScore, RoughlyUniform) {
  const CpuLayer layer = RandomKeysLayer(4, 50000, 1, 1, 1, 2024);
  const std::vector<float> s = RunCpuScorer(TableScorer("random"), layer, 2);
  constexpr int kBins = 20;
  std::vector<int64_t> bins(kBins, 0);
  double sum = 0;
  for (float u : s) {
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ++bins[static_cast<int>(u * kBins)];
    sum += u;
  }
  const double total = static_cast<double>(s.size());
  EXPECT_NEAR(sum / total, 0.5, 0.005);
  double chi2 = 0;
  const double expected = total / kBins;
  for (int64_t c : bins) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 43.8);  // chi-square, 19 degrees of freedom, p = 0.001
  // Serial correlation of neighbours within a head is near 0 (var of U(0,1) is 1/12).
  double cov = 0;
  for (size_t i = 0; i + 1 < 50000; ++i) cov += (s[i] - 0.5) * (s[i + 1] - 0.5);
  EXPECT_NEAR(cov / 49999.0 * 12.0, 0.0, 0.03);
}

}  // namespace
}  // namespace kvtrim
