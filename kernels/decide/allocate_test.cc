// Tests of the allocators (allocate.h) against the fp64 brute-force oracle: AdaKV (rule 4)
// totals and safeguard, the PyramidKV schedule (rule 5, baselines §4), uniform.
#include "kernels/decide/allocate.h"

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/oracle/selection_oracle.h"

namespace kvtrim {
namespace {

namespace ko = ::kvtrim::oracle;

TEST(AllocateUniform, EveryHeadKeepsK) {
  EXPECT_EQ(AllocateUniform(4, 7), (std::vector<int64_t>{7, 7, 7, 7}));
  EXPECT_EQ(AllocateUniform(1, 1), (std::vector<int64_t>{1}));
  EXPECT_TRUE(AllocateUniform(0, 5).empty());
}

// Scores [H, n] for AdaKV: per-head scale differences (so heads compete unequally), exact
// ties when `tied`, and +inf on the first `sink` and last `recent` tokens (protection).
std::vector<float> AdaScores(int64_t heads, int64_t n, uint64_t seed, bool tied, int64_t sink,
                             int64_t recent) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level(0, 3);
  std::vector<float> s(static_cast<size_t>(heads * n));
  for (int64_t h = 0; h < heads; ++h) {
    const float scale = 0.5f + static_cast<float>(h);
    for (int64_t j = 0; j < n; ++j) {
      float v = tied ? static_cast<float>(level(rng)) : scale * std::abs(normal(rng));
      if (j < sink || j >= n - recent) v = INFINITY;
      s[h * n + j] = v;
    }
  }
  return s;
}

std::vector<std::vector<double>> PerHead(const std::vector<float>& s, int64_t heads, int64_t n) {
  std::vector<std::vector<double>> out;
  for (int64_t h = 0; h < heads; ++h) out.emplace_back(s.begin() + h * n, s.begin() + (h + 1) * n);
  return out;
}

TEST(AllocateAdaKV, HandWrittenLayer) {
  // Two heads, n = 4, k = 2, alpha = 0.5: each head first keeps its top 1; the remaining
  // 2 go to the two largest leftovers, both in head 1.
  const std::vector<float> s = {4, 0, 0, 0,  //
                                1, 3, 2, 0};
  EXPECT_EQ(AllocateAdaKV(s.data(), 2, 4, 2, 0.5), (std::vector<int64_t>{1, 3}));
  // alpha = 1: everyone keeps exactly k.
  EXPECT_EQ(AllocateAdaKV(s.data(), 2, 4, 2, 1.0), (std::vector<int64_t>{2, 2}));
  // alpha = 0: one flat top-4 of {4,0,0,0,1,3,2,0}: 4 (h0), 3, 2, 1 (h1).
  EXPECT_EQ(AllocateAdaKV(s.data(), 2, 4, 2, 0.0), (std::vector<int64_t>{1, 3}));
  // Ties in the flat pass: lower token first, then lower head.
  const std::vector<float> t = {5, 1, 1, 0,  //
                                5, 1, 0, 0};
  // safeguard floor(0.5*2) = 1 each (token 0 of both); 2 more from the leftovers with score
  // 1: (h0, j1), (h1, j1) [token 1 before token 2], so h0 gets 2 and h1 gets 2.
  EXPECT_EQ(AllocateAdaKV(t.data(), 2, 4, 2, 0.5), (std::vector<int64_t>{2, 2}));
  // k = 1, alpha = 0: one flat top-2 over both heads: the two 5s, one per head.
  EXPECT_EQ(AllocateAdaKV(t.data(), 2, 4, 1, 0.0), (std::vector<int64_t>{1, 1}));
}

TEST(AllocateAdaKV, MatchesOracleConservesTotalsAndRespectsTheSafeguard) {
  int64_t cases = 0;
  for (int64_t heads : {1, 2, 4, 8}) {
    for (int64_t n : {1, 7, 64, 300}) {
      for (int64_t k : {int64_t{1}, n / 5 + 1, n / 2 + 1, n}) {
        if (k > n) continue;
        for (double alpha : {0.0, 0.2, 0.5, 1.0}) {
          for (const bool tied : {false, true}) {
            const int64_t sink = std::min<int64_t>(4, k / 4);
            const int64_t recent = std::min<int64_t>(8, (k - sink) / 3);
            const std::vector<float> s =
                AdaScores(heads, n, heads * 1000 + n * 10 + k, tied, sink, recent);
            const std::vector<int64_t> got = AllocateAdaKV(s.data(), heads, n, k, alpha);
            const ko::AdaKVResult want = ko::AdaKV(PerHead(s, heads, n), k, alpha);
            const std::string where = "H=" + std::to_string(heads) + " n=" + std::to_string(n) +
                                      " k=" + std::to_string(k) +
                                      " alpha=" + std::to_string(alpha) +
                                      " tied=" + std::to_string(tied);
            ASSERT_EQ(got, want.counts) << where;
            EXPECT_EQ(std::accumulate(got.begin(), got.end(), int64_t{0}), heads * k) << where;
            const int64_t safeguard = static_cast<int64_t>(std::floor(alpha * k));
            for (int64_t h = 0; h < heads; ++h) {
              EXPECT_GE(got[h], safeguard) << where << " head " << h;
              EXPECT_GE(got[h], std::min(k, sink + recent)) << where << " head " << h;
              EXPECT_LE(got[h], n) << where << " head " << h;
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 400);
}

TEST(AllocateAdaKV, ProtectedTokensAreNeverStarvedByAStrongHead) {
  // Head 0 has huge scores everywhere; head 1 has only its protected tokens at +inf.
  const int64_t n = 40, k = 10;
  std::vector<float> s(2 * n);
  for (int64_t j = 0; j < n; ++j) {
    s[j] = 1000.0f + static_cast<float>(j);
    s[n + j] = 0.001f;
  }
  for (int64_t j : {0, 1, 2, 3, 37, 38, 39}) s[n + j] = INFINITY;  // 4 sinks + 3 recent
  const std::vector<int64_t> got = AllocateAdaKV(s.data(), 2, n, k, 0.2);
  EXPECT_EQ(got, (std::vector<int64_t>{13, 7}));
  EXPECT_EQ(got, ko::AdaKV(PerHead(s, 2, n), k, 0.2).counts);
}

TEST(AllocatePyramid, MatchesOracleScheduleOverAGrid) {
  int64_t cases = 0;
  for (int64_t n : {16, 100, 1000, 4096}) {
    for (int64_t k : {int64_t{1}, int64_t{8}, n / 10, n / 4, n / 2, n}) {
      if (k < 1) continue;
      for (int32_t L : {1, 2, 3, 32}) {
        for (double beta : {1.5, 5.0, 20.0}) {
          for (int64_t prot : {int64_t{0}, int64_t{4}, int64_t{36}}) {
            const int64_t p = std::min(prot, k);
            int64_t total = 0;
            for (int32_t l = 0; l < L; ++l) {
              const int64_t got = PyramidLayerBudget(k, n, l, L, beta, p);
              ASSERT_EQ(got, ko::PyramidLayerBudget(k, n, l, L, beta, p))
                  << "k=" << k << " n=" << n << " layer " << l << "/" << L << " beta=" << beta
                  << " protected=" << p;
              EXPECT_GE(got, std::max<int64_t>(1, p)) << "layer " << l;
              EXPECT_LE(got, n) << "layer " << l;
              total += got;
              ++cases;
            }
            // Conserved up to round-half-up of symmetric pairs: within L/2 of L*k.
            EXPECT_LE(std::abs(total - static_cast<int64_t>(L) * k), L / 2 + 1)
                << "k=" << k << " n=" << n << " L=" << L << " beta=" << beta;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 3000);
}

TEST(AllocatePyramid, ExactHalvesRoundUpAtEveryDepth) {
  // Sweeps budgets whose schedule hits exact .5 values (k/beta = m + 0.5 at the last layer,
  // midpoints elsewhere), where evaluation order in double could flip the rounding.
  int64_t mismatches = 0;
  std::string first_mismatch;
  for (int64_t k = 1; k <= 400; ++k) {
    for (int32_t L = 2; L <= 40; ++L) {
      for (double beta : {2.0, 4.0, 20.0}) {
        for (int64_t n : {k, 10 * k}) {
          for (int32_t l = 0; l < L; ++l) {
            const int64_t got = PyramidLayerBudget(k, n, l, L, beta, 1);
            const int64_t want = ko::PyramidLayerBudget(k, n, l, L, beta, 1);
            if (got != want && mismatches++ == 0) {
              first_mismatch = "k=" + std::to_string(k) + " n=" + std::to_string(n) + " layer " +
                               std::to_string(l) + "/" + std::to_string(L) +
                               " beta=" + std::to_string(beta) + ": got " + std::to_string(got) +
                               ", want " + std::to_string(want);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "first: " << first_mismatch;
}

TEST(AllocatePyramid, HandWrittenSchedules) {
  // k = 100, beta = 20, L = 5, n large: k_4 = 5, k_0 = 195, step 47.5.
  const std::vector<int64_t> want = {195, 148, 100, 53, 5};  // 147.5 -> 148, 52.5 -> 53
  for (int32_t l = 0; l < 5; ++l) {
    EXPECT_EQ(PyramidLayerBudget(100, 10000, l, 5, 20.0, 0), want[l]) << "layer " << l;
  }
  // k_0 clamped to n = 150: k_4 = 2*100 - 150 = 50, step 25.
  const std::vector<int64_t> clamped = {150, 125, 100, 75, 50};
  for (int32_t l = 0; l < 5; ++l) {
    EXPECT_EQ(PyramidLayerBudget(100, 150, l, 5, 20.0, 0), clamped[l]) << "layer " << l;
  }
  // k/beta = 5 < 32 protected tokens: the last layer is clamped up to 32, k_0 = 168.
  const std::vector<int64_t> windowed = {168, 134, 100, 66, 32};
  for (int32_t l = 0; l < 5; ++l) {
    EXPECT_EQ(PyramidLayerBudget(100, 10000, l, 5, 20.0, 32), windowed[l]) << "layer " << l;
  }
  // More protected tokens than k leaves k_0 < k_{L-1}: infeasible, uniform fallback.
  for (int32_t l = 0; l < 4; ++l) EXPECT_EQ(PyramidLayerBudget(10, 100, l, 4, 20.0, 12), 10);
  // A single layer keeps k.
  EXPECT_EQ(PyramidLayerBudget(37, 100, 0, 1, 20.0, 0), 37);
  // Monotone: deeper layers never keep more.
  for (int32_t l = 1; l < 32; ++l) {
    EXPECT_LE(PyramidLayerBudget(512, 8192, l, 32, 20.0, 8),
              PyramidLayerBudget(512, 8192, l - 1, 32, 20.0, 8));
  }
}

}  // namespace
}  // namespace kvtrim
