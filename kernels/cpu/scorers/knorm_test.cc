// Conformance tests of the K-norm scorer (specs/baselines.md §8) on the CPU: its exact
// scorer against its definition, an fp64 reference and the canonical eight-lane dot product;
// its fast scorer against the exact one. Found through the CPU scorer table, as the backend
// finds it.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/cpu_scorer_table.h"
#include "tests/testing/cpu_keys_layer.h"

namespace kvtrim {
namespace {

using testing::RandomKeysLayer;
using testing::RunCpuScorer;
using testing::TableScorer;

/// K-norm's exact scorer, from the table.
CpuScoreFn KnormExact() { return TableScorer("knorm"); }

TEST(KnormScore, IsMinusTheL2NormAgainstFp64) {
  for (int64_t d : {1, 7, 64, 128}) {
    const CpuLayer layer = RandomKeysLayer(3, 99, d, 100 + d, 0, 0, 3.0f);
    const std::vector<float> s = RunCpuScorer(KnormExact(), layer, 2);
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t j = 0; j < 99; ++j) {
        const float* k = layer.keys.row(h, j);
        double sq = 0;
        for (int64_t c = 0; c < d; ++c) sq += static_cast<double>(k[c]) * k[c];
        const double ref = -std::sqrt(sq);
        ASSERT_NEAR(s[h * 99 + j], ref, 1e-6 * std::abs(ref) + 1e-30)
            << "d=" << d << " head " << h << " token " << j;
        ASSERT_LE(s[h * 99 + j], 0.0f);
      }
    }
  }
}

TEST(KnormScore, SmallerKeysScoreHigherAndThreadsDoNotChangeBits) {
  CpuLayer layer = RandomKeysLayer(2, 500, 16, 9);
  const std::vector<float> one = RunCpuScorer(KnormExact(), layer, 1);
  const std::vector<float> four = RunCpuScorer(KnormExact(), layer, 4);
  EXPECT_EQ(one, four);
  // Scaling the whole layer by 2 scales every score by 2 exactly (powers of two are exact).
  std::vector<float> doubled(layer.keys.data(), layer.keys.data() + 2 * 500 * 16);
  for (float& x : doubled) x *= 2.0f;
  CpuLayer scaled = layer;
  scaled.keys = F32Tensor::Owning(std::move(doubled), {2, 500, 16});
  const std::vector<float> two = RunCpuScorer(KnormExact(), scaled, 1);
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(two[i], 2.0f * one[i]);
}

TEST(KnormScore, ZeroKeyScoresZero) {
  CpuLayer layer;
  layer.shape.num_kv_heads = 1;
  layer.shape.num_tokens = 2;
  layer.shape.head_dim = 3;
  layer.keys = F32Tensor::Owning({0, 0, 0, 3, 4, 0}, {1, 2, 3});
  const std::vector<float> s = RunCpuScorer(KnormExact(), layer, 1);
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[1], -5.0f);
}

TEST(KnormScore, BitIdenticalToTheCanonicalEightLaneDot) {
  // The canonical definition (kernels/canonical_math.h) written out: lane c % 8 accumulates
  // k[c]^2 in increasing c, the lanes meet as ((0+1)+(2+3))+((4+5)+(6+7)), then sqrt.
  for (int64_t d : {1, 5, 8, 9, 64, 128, 131}) {
    const CpuLayer layer = RandomKeysLayer(2, 77, d, 300 + d, 0, 0, 5.0f);
    const std::vector<float> s = RunCpuScorer(KnormExact(), layer, 3);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < 77; ++j) {
        const float* k = layer.keys.row(h, j);
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t c = 0; c < d; ++c) lane[c % 8] = lane[c % 8] + k[c] * k[c];
        const float sq = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        const float ref = -std::sqrt(sq);
        ASSERT_EQ(0, std::memcmp(&ref, &s[h * 77 + j], sizeof(float)))
            << "d=" << d << " head " << h << " token " << j << ": " << s[h * 77 + j] << " vs "
            << ref;
      }
    }
  }
}

TEST(KnormScore, FastIsTheExactNormWithinFp32Rounding) {
  ASSERT_NE(CpuScorerTable::Builtin().Find("knorm")->fast, nullptr);
  for (int64_t d : {8, 64, 128, 131}) {
    const CpuLayer layer = RandomKeysLayer(3, 301, d, 500 + d, 0, 0, 2.0f);
    const std::vector<float> exact = RunCpuScorer(KnormExact(), layer, 2);
    const CpuScoreFn knorm_fast = TableScorer("knorm", /*fast=*/true);
    const std::vector<float> fast = RunCpuScorer(knorm_fast, layer, 2);
    const std::vector<float> fast_threads = RunCpuScorer(knorm_fast, layer, 5);
    EXPECT_EQ(fast, fast_threads) << "d=" << d;  // the same bits on any thread count
    for (size_t i = 0; i < exact.size(); ++i) {
      ASSERT_LE(fast[i], 0.0f);
      ASSERT_NEAR(fast[i], exact[i], 1e-5 * std::abs(exact[i])) << "d=" << d << " at " << i;
    }
  }
}

}  // namespace
}  // namespace kvtrim
