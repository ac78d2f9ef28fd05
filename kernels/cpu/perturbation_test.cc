// OutputPerturbation vs direct recomputation in the fp64 oracle, and Lemma 1.
#include "kernels/cpu/perturbation.h"
#include "tests/testing/attention_test_layer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

std::vector<double> Perturbation(const oracle::AttentionProblem& pb,
                                 const std::vector<int64_t>& offsets,
                                 const std::vector<int32_t>& kept, int threads = 2) {
  ThreadPool pool(threads);
  std::vector<double> out(static_cast<size_t>(pb.num_kv_heads), -1.0);
  OutputPerturbation(MakeLayer(pb), offsets, kept, pool, out.data());
  return out;
}

// Appends a random ascending kept list of a random size in [0, n] to `kept`.
void RandomKeptList(std::mt19937_64& rng, int64_t n, std::vector<int32_t>* kept) {
  std::uniform_int_distribution<int64_t> size_dist(0, n);
  const int64_t size = size_dist(rng);
  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) all[j] = static_cast<int32_t>(j);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(size));
  std::sort(all.begin(), all.end());
  kept->insert(kept->end(), all.begin(), all.end());
}

struct Case {
  int64_t h_kv, group, n, d, w;
};

TEST(PerturbationTest, MatchesDirectRecomputationOnRandomKeptSets) {
  const std::vector<Case> cases = {{1, 1, 1, 8, 1},   {2, 4, 7, 8, 3},   {3, 7, 99, 16, 8},
                                   {2, 1, 40, 32, 40}, {1, 4, 120, 16, 16},
                                   {2, 4, 5, 8, 8}};  // w > n: rows at negative positions see nothing
  std::mt19937_64 rng(77);
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE(testing::Message() << "H_kv=" << c.h_kv << " G=" << c.group << " n=" << c.n
                                      << " w=" << c.w << " trial " << trial);
      std::vector<int64_t> offsets = {0};
      std::vector<int32_t> kept;
      for (int64_t h = 0; h < c.h_kv; ++h) {
        RandomKeptList(rng, c.n, &kept);
        offsets.push_back(static_cast<int64_t>(kept.size()));
      }
      if (c.h_kv == 1) offsets = {0, static_cast<int64_t>(kept.size())};
      const std::vector<double> got = Perturbation(pb, offsets, kept);
      const std::vector<double> want = oracle::OutputPerturbation(pb, offsets, kept);
      for (int64_t h = 0; h < c.h_kv; ++h) EXPECT_NEAR(got[h], want[h], 1e-9) << "head " << h;
    }
  }
}

TEST(PerturbationTest, SharedListServesEveryHead) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(81, 4, 2, 60, 8, 6, 2.0);
  std::vector<int32_t> kept;
  for (int32_t j = 0; j < 60; j += 3) kept.push_back(j);
  const std::vector<int64_t> shared = {0, static_cast<int64_t>(kept.size())};
  const std::vector<double> got = Perturbation(pb, shared, kept);
  const std::vector<double> want = oracle::OutputPerturbation(pb, shared, kept);
  // The same list repeated per head gives the same answer.
  std::vector<int64_t> offsets = {0};
  std::vector<int32_t> repeated;
  for (int h = 0; h < 4; ++h) {
    repeated.insert(repeated.end(), kept.begin(), kept.end());
    offsets.push_back(static_cast<int64_t>(repeated.size()));
  }
  const std::vector<double> per_head = Perturbation(pb, offsets, repeated);
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_NEAR(got[h], want[h], 1e-9) << h;
    EXPECT_EQ(got[h], per_head[h]) << h;
    EXPECT_GT(got[h], 0.0) << h;
  }
}

TEST(PerturbationTest, KeepingEverythingGivesZeroAndNothingGivesOne) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(83, 3, 4, 33, 16, 8, 2.0);
  std::vector<int32_t> all;
  for (int32_t j = 0; j < 33; ++j) all.push_back(j);
  std::vector<int64_t> offsets = {0};
  std::vector<int32_t> kept;
  for (int h = 0; h < 3; ++h) {
    kept.insert(kept.end(), all.begin(), all.end());
    offsets.push_back(static_cast<int64_t>(kept.size()));
  }
  for (double x : Perturbation(pb, offsets, kept)) EXPECT_EQ(x, 0.0);
  for (double x : Perturbation(pb, {0, 0, 0, 0}, {})) EXPECT_EQ(x, 1.0);
}

// Rows that see no kept token contribute 1: n = 10, w = 4 (rows at positions 6..9), only
// token 9 kept. Rows 0..2 give 1 each; the last row gives ||v_9 - a|| / ||a||.
TEST(PerturbationTest, RowsThatSeeNoKeptTokenCountOne) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(85, 1, 1, 10, 8, 4, 2.0);
  const std::vector<double> got = Perturbation(pb, {0, 1}, {9});
  const std::vector<double> a = oracle::OutputMatrix(pb, 0);  // [4, 8]
  double diff = 0, norm = 0;
  for (int i = 0; i < 8; ++i) {
    const double ai = a[3 * 8 + i];
    diff += (pb.values[9 * 8 + i] - ai) * (pb.values[9 * 8 + i] - ai);
    norm += ai * ai;
  }
  EXPECT_NEAR(got[0], (3.0 + std::sqrt(diff / norm)) / 4.0, 1e-9);
}

// Lemma 1 through the kernel: evicting token j alone moves row t's output by
// p_j / (1 - p_j) ||a_t - v_j|| (rows that cannot see j do not move).
TEST(PerturbationTest, SingleEvictionMatchesLemma1) {
  const int64_t n = 25, d = 8, w = 5, group = 2;
  const oracle::AttentionProblem pb = oracle::RandomProblem(87, 1, group, n, d, w, 2.0);
  for (int64_t evicted : {0, 7, 20, 21, 24}) {
    std::vector<int32_t> kept;
    for (int32_t j = 0; j < n; ++j) {
      if (j != evicted) kept.push_back(j);
    }
    const std::vector<double> got = Perturbation(pb, {0, static_cast<int64_t>(kept.size())}, kept);
    double want = 0;
    for (int64_t g = 0; g < group; ++g) {
      const std::vector<double> p = oracle::ProbMatrix(pb, g);
      const std::vector<double> a = oracle::OutputMatrix(pb, g);
      for (int64_t t = 0; t < w; ++t) {
        const double pj = p[t * n + evicted];
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < d; ++i) {
          const double r = a[t * d + i] - pb.values[evicted * d + i];
          diff += r * r;
          norm += a[t * d + i] * a[t * d + i];
        }
        want += pj / (1 - pj) * std::sqrt(diff / norm);
      }
    }
    want /= static_cast<double>(group * w);
    EXPECT_NEAR(got[0], want, 1e-9 * std::max(1.0, want)) << "evicted " << evicted;
    EXPECT_GT(got[0], 0.0);
  }
}

TEST(PerturbationTest, ZeroOutputsGiveZero) {
  oracle::AttentionProblem pb = oracle::RandomProblem(89, 2, 2, 12, 8, 3, 1.0);
  std::fill(pb.values.begin(), pb.values.end(), 0.0f);
  for (double x : Perturbation(pb, {0, 3}, {1, 4, 11})) EXPECT_EQ(x, 0.0);
  for (double x : Perturbation(pb, {0, 0}, {})) EXPECT_EQ(x, 0.0);
}

TEST(PerturbationTest, DeterministicAcrossThreadCounts) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(91, 5, 4, 80, 16, 8, 2.0);
  std::mt19937_64 rng(92);
  std::vector<int64_t> offsets = {0};
  std::vector<int32_t> kept;
  for (int h = 0; h < 5; ++h) {
    RandomKeptList(rng, 80, &kept);
    offsets.push_back(static_cast<int64_t>(kept.size()));
  }
  EXPECT_EQ(Perturbation(pb, offsets, kept, 1), Perturbation(pb, offsets, kept, 4));
}

}  // namespace
}  // namespace kvtrim
