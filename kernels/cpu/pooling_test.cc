// Tests of the 1-D pooling used by SnapKV and DropKV against the padded oracle.
#include "kernels/cpu/pooling.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

std::vector<float> Pooled(PoolKind kind, const std::vector<float>& in, int64_t kernel) {
  std::vector<float> out(in.size(), -123.0f);
  Pool1D(kind, in.data(), static_cast<int64_t>(in.size()), kernel, out.data());
  return out;
}

TEST(PoolingTest, MaxHandCases) {
  EXPECT_EQ(Pooled(PoolKind::kMax, {1, 3, 2}, 3), (std::vector<float>{3, 3, 3}));
  // -inf padding: all-negative edges must not pick up a 0 from the padding.
  EXPECT_EQ(Pooled(PoolKind::kMax, {-1, -2, -3, -4}, 3), (std::vector<float>{-1, -1, -2, -3}));
  EXPECT_EQ(Pooled(PoolKind::kMax, {5, 0, 0, 0, 0, 0, 7}, 5),
            (std::vector<float>{5, 5, 5, 0, 7, 7, 7}));
  EXPECT_EQ(Pooled(PoolKind::kMax, {4}, 11), (std::vector<float>{4}));
}

TEST(PoolingTest, AvgHandCasesCountPadding) {
  // Zero padding, always divided by the kernel (count_include_pad=True).
  EXPECT_EQ(Pooled(PoolKind::kAvg, {3, 6, 9}, 3), (std::vector<float>{3, 6, 5}));
  EXPECT_EQ(Pooled(PoolKind::kAvg, {7}, 7), (std::vector<float>{1}));
  EXPECT_EQ(Pooled(PoolKind::kAvg, {1, 2, 3, 4, 5}, 5),
            (std::vector<float>{6.0f / 5, 10.0f / 5, 15.0f / 5, 14.0f / 5, 12.0f / 5}));
}

TEST(PoolingTest, KernelOneCopies) {
  const std::vector<float> in = {0.5f, -1.0f, 2.0f};
  EXPECT_EQ(Pooled(PoolKind::kMax, in, 1), in);
  EXPECT_EQ(Pooled(PoolKind::kAvg, in, 1), in);
}

TEST(PoolingTest, InfinityPropagatesThroughMax) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Pooled(PoolKind::kMax, {0, 0, 0, inf, 0, 0, 0}, 3),
            (std::vector<float>{0, 0, inf, inf, inf, 0, 0}));
}

TEST(PoolingTest, PoolPrefixPoolsThePrefixAloneAndFillsTheWindowWithItsMax) {
  // n = 7, prefix 4: the window [4, 7) holds a spike that must not reach tokens 2 and 3.
  const std::vector<float> in = {1, 0, 0, 2, 50, 60, 70};
  std::vector<float> out(7, -123.0f);
  PoolPrefix(PoolKind::kMax, in.data(), 7, 4, 5, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 2, 2, 2, 2, 2}));
  PoolPrefix(PoolKind::kAvg, in.data(), 7, 4, 3, out.data());  // zero padding at P as well
  EXPECT_EQ(out, (std::vector<float>{1.0f / 3, 1.0f / 3, 2.0f / 3, 2.0f / 3, 2.0f / 3,
                                     2.0f / 3, 2.0f / 3}));
  PoolPrefix(PoolKind::kMax, in.data(), 7, 7, 3, out.data());  // no window: plain Pool1D
  EXPECT_EQ(out, Pooled(PoolKind::kMax, in, 3));
  PoolPrefix(PoolKind::kMax, in.data(), 3, 0, 3, out.data());  // no prefix: the window is 0
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), (std::vector<float>{0, 0, 0}));
}

TEST(PoolingTest, FirstMaxKeepsTheFirstOfEqualValues) {
  const std::vector<float> zeros = {-0.0f, 0.0f};
  EXPECT_TRUE(std::signbit(FirstMax(zeros.data(), 2)));
  const std::vector<float> rev = {0.0f, -0.0f};
  EXPECT_FALSE(std::signbit(FirstMax(rev.data(), 2)));
  const std::vector<float> x = {-3, 5, -1, 5};
  EXPECT_EQ(FirstMax(x.data(), 4), 5.0f);
  EXPECT_EQ(FirstMax(x.data(), 1), -3.0f);
  EXPECT_EQ(FirstMax(x.data(), 0), 0.0f);
}

TEST(PoolingTest, MatchesOracleOnRandomInputs) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0, 1);
  for (int64_t n : {1, 2, 7, 99, 1000}) {
    for (int64_t kernel : {1, 3, 5, 7, 11, 15, 201}) {
      std::vector<float> in(static_cast<size_t>(n));
      for (auto& x : in) x = static_cast<float>(normal(rng));
      const std::vector<double> in_d(in.begin(), in.end());
      for (bool max_pool : {true, false}) {
        const std::vector<float> got = Pooled(max_pool ? PoolKind::kMax : PoolKind::kAvg, in, kernel);
        const std::vector<double> want = oracle::Pool(in_d, kernel, max_pool);
        for (int64_t j = 0; j < n; ++j) {
          if (max_pool) {
            ASSERT_EQ(got[j], want[j]) << "n=" << n << " kernel=" << kernel << " j=" << j;
          } else {
            ASSERT_NEAR(got[j], want[j], 1e-6 * (1 + std::abs(want[j])))
                << "n=" << n << " kernel=" << kernel << " j=" << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtrim
