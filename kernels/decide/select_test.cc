// Tests of the selectors (select.h) against the fp64 brute-force oracle: ties to the lower
// index, +inf (protected) and -inf scores, ascending output, append semantics.
#include "kernels/decide/select.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/oracle/selection_oracle.h"

namespace kvtrim {
namespace {

namespace ko = ::kvtrim::oracle;

// Random scores [n] with many exact ties: small integers, a few +inf and -inf.
std::vector<float> TiedScores(int64_t n, uint64_t seed, int levels = 5) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> level(0, levels - 1);
  std::uniform_int_distribution<int> special(0, 19);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& x : s) {
    const int r = special(rng);
    x = r == 0 ? INFINITY : r == 1 ? -INFINITY : static_cast<float>(level(rng)) * 0.25f - 0.5f;
  }
  return s;
}

// Random continuous scores [n] (ties only by accident).
std::vector<float> SmoothScores(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& x : s) x = normal(rng);
  return s;
}

std::vector<double> ToDouble(const float* s, int64_t n) { return std::vector<double>(s, s + n); }

std::vector<int64_t> ToInt64(const std::vector<int32_t>& v, size_t from = 0) {
  return std::vector<int64_t>(v.begin() + from, v.end());
}

TEST(SelectTopK, HandWrittenTiesAndInfinities) {
  const std::vector<float> s = {1, 3, 3, 2, INFINITY, -INFINITY, 3};
  std::vector<int32_t> out;
  SelectTopK(s.data(), 7, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 4}));  // +inf, then the first of the three 3s
  out.clear();
  SelectTopK(s.data(), 7, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 4, 6}));
  out.clear();
  SelectTopK(s.data(), 7, 7, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  out.clear();
  SelectTopK(s.data(), 7, 0, &out);
  EXPECT_TRUE(out.empty());
  // All equal: the lowest indices.
  const std::vector<float> flat(10, 0.5f);
  out.clear();
  SelectTopK(flat.data(), 10, 3, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2}));
}

TEST(SelectTopK, MatchesOracleOnRandomTiedAndSmoothScores) {
  for (int64_t n : {1, 2, 7, 99, 1000, 4097}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      for (const bool tied : {true, false}) {
        const std::vector<float> s = tied ? TiedScores(n, seed + n) : SmoothScores(n, seed + n);
        for (int64_t count : {int64_t{1}, n / 3, n / 2, n - 1, n}) {
          if (count < 0) continue;
          std::vector<int32_t> out = {-7, -8};  // SelectTopK appends after existing content
          SelectTopK(s.data(), n, count, &out);
          ASSERT_GE(out.size(), 2u);
          EXPECT_EQ(out[0], -7);
          EXPECT_EQ(out[1], -8);
          EXPECT_EQ(ToInt64(out, 2), ko::TopKByRank(ToDouble(s.data(), n), count))
              << "n=" << n << " count=" << count << " tied=" << tied << " seed=" << seed;
        }
      }
    }
  }
}

TEST(SelectTopK, MoreInfinitiesThanTheCountKeepsTheLowestInfiniteIndices) {
  std::vector<float> s(50, 1.0f);
  for (int64_t j : {3, 9, 20, 41, 49}) s[j] = INFINITY;
  std::vector<int32_t> out;
  SelectTopK(s.data(), 50, 3, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 9, 20}));
  s.assign(50, -INFINITY);
  out.clear();
  SelectTopK(s.data(), 50, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(SelectTopK, SignedZerosTieAndNegativeAndSubnormalScoresKeepTheirOrder) {
  // The selection compares bit patterns made monotone: -0 and +0 must still tie (lower
  // index first), negative scores order by magnitude reversed, subnormals above 0.
  const float tiny = 1e-40f;  // subnormal
  const std::vector<float> s = {-0.0f, -1.5f, 0.0f, tiny, -tiny, -1.25f, -0.0f, -3e38f};
  std::vector<int32_t> out;
  SelectTopK(s.data(), 8, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 3}));  // tiny, then the first zero (-0 at 0)
  out.clear();
  SelectTopK(s.data(), 8, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 2, 3, 6}));
  out.clear();
  SelectTopK(s.data(), 8, 6, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 2, 3, 4, 5, 6}));  // -tiny, then -1.25
  out.clear();
  SelectTopK(s.data(), 8, 7, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(SelectRankTokens, MatchesOracleRanking) {
  for (int64_t n : {1, 7, 99, 1000}) {
    for (const bool tied : {true, false}) {
      const std::vector<float> s = tied ? TiedScores(n, 17 * n) : SmoothScores(n, 17 * n);
      std::vector<int32_t> ranking;
      RankTokens(s.data(), n, &ranking);
      EXPECT_EQ(ToInt64(ranking), ko::RankByScore(ToDouble(s.data(), n)))
          << "n=" << n << " tied=" << tied;
    }
  }
  const std::vector<float> s = {0, 2, INFINITY, 2, -INFINITY};
  std::vector<int32_t> ranking = {99, 98};  // written, not appended
  RankTokens(s.data(), 5, &ranking);
  EXPECT_EQ(ranking, (std::vector<int32_t>{2, 1, 3, 0, 4}));
}

TEST(SelectSharedRoundRobin, HandWrittenWalk) {
  // Head 0 ranks 0,1,2,3; head 1 ranks 3,0,2,1. Round robin: 0 (h0), 3 (h1), 1 (h0), ...
  const std::vector<float> s = {4, 3, 2, 1,  //
                                3, 1, 2, 4};
  std::vector<int32_t> out;
  SelectSharedRoundRobin(s.data(), 2, 4, 1, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0}));
  out.clear();
  SelectSharedRoundRobin(s.data(), 2, 4, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 3}));
  out.clear();
  // Rank 1: head 0 -> 1 (new), head 1 -> 0 (seen, skipped); rank 2: head 0 -> 2.
  SelectSharedRoundRobin(s.data(), 2, 4, 3, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3}));
  out.clear();
  SelectSharedRoundRobin(s.data(), 2, 4, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(SelectSharedRoundRobin, MatchesOracleWithTiesAndInfinities) {
  for (int64_t heads : {1, 2, 5}) {
    for (int64_t n : {1, 7, 99, 500}) {
      for (const bool tied : {true, false}) {
        std::vector<float> s;
        std::vector<std::vector<double>> per_head;
        for (int64_t h = 0; h < heads; ++h) {
          const std::vector<float> row =
              tied ? TiedScores(n, 100 * h + n, 3) : SmoothScores(n, 100 * h + n);
          s.insert(s.end(), row.begin(), row.end());
          per_head.push_back(ToDouble(row.data(), n));
        }
        for (int64_t count : {int64_t{1}, n / 4, n / 2, n}) {
          if (count < 1) continue;
          std::vector<int32_t> out = {42};
          SelectSharedRoundRobin(s.data(), heads, n, count, &out);
          ASSERT_FALSE(out.empty());
          EXPECT_EQ(out[0], 42);
          const std::vector<int64_t> got = ToInt64(out, 1);
          EXPECT_EQ(got, ko::SharedRoundRobin(per_head, count))
              << "H=" << heads << " n=" << n << " count=" << count << " tied=" << tied;
          EXPECT_EQ(static_cast<int64_t>(got.size()), count);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtrim
