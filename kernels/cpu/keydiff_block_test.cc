// Tests of the block-wise KeyDiff simulator (specs/keydiff.md §2.3): conformance tests 3, 4
// and 5 of keydiff.md §8, the tie rule, and agreement with a naive fp64 block oracle.
#include "kernels/cpu/keydiff_block.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/decide/select.h"
#include "tests/oracle/keydiff_oracle.h"

namespace kvtrim {
namespace {

namespace ko = ::kvtrim::oracle;

// Keys [T, d] of one head: a shared offset plus N(0, 1) noise, log-normal norms.
std::vector<float> HeadKeys(int64_t T, int64_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> dir(static_cast<size_t>(d));
  for (float& x : dir) x = 1.2f * normal(rng);
  std::vector<float> keys(static_cast<size_t>(T * d));
  for (int64_t j = 0; j < T; ++j) {
    const float scale = std::exp(0.4f * normal(rng));
    for (int64_t c = 0; c < d; ++c) keys[j * d + c] = scale * (dir[c] + normal(rng));
  }
  return keys;
}

ko::KeyMatrix ToMatrix(const std::vector<float>& keys, int64_t T, int64_t d) {
  ko::KeyMatrix m;
  for (int64_t j = 0; j < T; ++j) m.emplace_back(keys.begin() + j * d, keys.begin() + (j + 1) * d);
  return m;
}

ko::KeyDiffAnchorMode OracleMode(KeyDiffAnchor a) {
  return a == KeyDiffAnchor::kRawMean ? ko::KeyDiffAnchorMode::kRawMean
                                      : ko::KeyDiffAnchorMode::kNormalizedMean;
}

KeyDiffBlockOptions Options(int64_t N, int64_t B,
                            KeyDiffAnchor anchor = KeyDiffAnchor::kNormalizedMean,
                            double recent = 0.0) {
  KeyDiffBlockOptions o;
  o.budget = N;
  o.block_size = B;
  o.anchor = anchor;
  o.recent_fraction = recent;
  return o;
}

// ---- Conformance 3: memory bound, cache size, sorted unique indices --------------------------

TEST(KeyDiffBlock, CacheBoundSizeAndOrderAfterEveryStep) {
  std::mt19937_64 rng(99);
  std::uniform_int_distribution<int64_t> pick_t(0, 600), pick_n(1, 80), pick_b(1, 100);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t T = pick_t(rng), N = pick_n(rng), B = pick_b(rng), d = 1 + trial % 9;
    const double recent = (trial % 4) * 0.1;
    const std::vector<float> keys = HeadKeys(T, d, 1000 + trial);
    const std::string where = "T=" + std::to_string(T) + " N=" + std::to_string(N) +
                              " B=" + std::to_string(B) + " x=" + std::to_string(recent);
    int64_t steps_seen = 0, prev_seen = 0, max_before = 0;
    auto observer = [&](const KeyDiffBlockStep& s) {
      EXPECT_EQ(s.step, steps_seen) << where;
      ++steps_seen;
      EXPECT_LE(s.size_before, N + B) << where;
      // After the append: what was kept before plus the whole new block.
      EXPECT_EQ(s.size_before, std::min(N, prev_seen) + (s.tokens_seen - prev_seen)) << where;
      prev_seen = s.tokens_seen;
      max_before = std::max(max_before, s.size_before);
      EXPECT_EQ(s.size_after, std::min(N, s.tokens_seen)) << where << " step " << s.step;
      EXPECT_EQ(s.tokens_seen, std::min(T, (s.step + 1) * B)) << where;
      for (int64_t i = 0; i < s.size_after; ++i) {
        ASSERT_GE(s.positions[i], 0) << where;
        ASSERT_LT(s.positions[i], s.tokens_seen) << where;
        if (i > 0) {
          ASSERT_LT(s.positions[i - 1], s.positions[i]) << where << " step " << s.step;
        }
      }
    };
    absl::StatusOr<KeyDiffBlockResult> r = RunKeyDiffBlocks(
        keys.data(), T, d, Options(N, B, KeyDiffAnchor::kNormalizedMean, recent), observer);
    ASSERT_TRUE(r.ok()) << r.status() << " " << where;
    EXPECT_EQ(r->num_steps, (T + B - 1) / B) << where;
    EXPECT_EQ(steps_seen, r->num_steps) << where;
    EXPECT_LE(r->max_cache_size, N + B) << where;
    EXPECT_EQ(r->max_cache_size, max_before) << where;
    EXPECT_EQ(static_cast<int64_t>(r->kept.size()), std::min(N, T)) << where;
    EXPECT_EQ(r->num_evicted, T - std::min(N, T)) << where;
    EXPECT_TRUE(std::is_sorted(r->kept.begin(), r->kept.end())) << where;
    EXPECT_EQ(std::set<int64_t>(r->kept.begin(), r->kept.end()).size(), r->kept.size()) << where;
  }
}

// ---- Conformance 4: B = T is one-shot; B = 1 evicts one per step ------------------------------

TEST(KeyDiffBlock, OneBlockOfTheWholeSequenceIsOneShotSelection) {
  for (const KeyDiffAnchor anchor : {KeyDiffAnchor::kNormalizedMean, KeyDiffAnchor::kRawMean}) {
    for (int64_t T : {1, 9, 100, 777}) {
      for (int64_t N : {int64_t{1}, T / 3 + 1, T}) {
        const int64_t d = 16;
        const std::vector<float> keys = HeadKeys(T, d, 3 * T + N);
        for (int64_t B : {T, T + 5}) {
          absl::StatusOr<KeyDiffBlockResult> r =
              RunKeyDiffBlocks(keys.data(), T, d, Options(N, B, anchor));
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_EQ(r->num_steps, 1);
          // The same selection from the §2.2 scores of all T keys.
          std::vector<float> norms(T), scores(T);
          KeyDiffHeadScores(keys.data(), T, d, anchor, 1e-8f, norms.data(), scores.data());
          std::vector<int32_t> top;
          SelectTopK(scores.data(), T, N, &top);
          const std::vector<int64_t> expected(top.begin(), top.end());
          EXPECT_EQ(r->kept, expected) << "T=" << T << " N=" << N << " B=" << B;
          // And the fp64 oracle agrees.
          EXPECT_EQ(r->kept, ko::OneShotSelect(ToMatrix(keys, T, d), N, OracleMode(anchor), 0.0))
              << "T=" << T << " N=" << N;
        }
      }
    }
  }
}

TEST(KeyDiffBlock, SingleTokenBlocksEvictExactlyOnePerStepOnceFull) {
  const int64_t T = 300, N = 40, d = 8;
  const std::vector<float> keys = HeadKeys(T, d, 5);
  std::vector<int64_t> previous;
  auto observer = [&](const KeyDiffBlockStep& s) {
    std::vector<int64_t> now(s.positions, s.positions + s.size_after);
    if (s.tokens_seen <= N) {
      EXPECT_EQ(s.size_before, s.tokens_seen);
      EXPECT_EQ(s.size_after, s.tokens_seen);
    } else {
      EXPECT_EQ(s.size_before, N + 1) << "step " << s.step;
      EXPECT_EQ(s.size_after, N) << "step " << s.step;
      // Exactly one of (previous cache + the new token) is gone.
      std::vector<int64_t> candidates = previous;
      candidates.push_back(s.tokens_seen - 1);
      int64_t missing = 0;
      for (int64_t p : candidates) missing += !std::binary_search(now.begin(), now.end(), p);
      EXPECT_EQ(missing, 1) << "step " << s.step;
    }
    previous = now;
  };
  absl::StatusOr<KeyDiffBlockResult> r =
      RunKeyDiffBlocks(keys.data(), T, d, Options(N, 1), observer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_evicted, T - N);
  EXPECT_EQ(r->max_cache_size, N + 1);
}

// ---- Against the naive fp64 block oracle -----------------------------------------------------

TEST(KeyDiffBlock, MatchesTheFp64BlockOracle) {
  int64_t cases = 0;
  for (const KeyDiffAnchor anchor : {KeyDiffAnchor::kNormalizedMean, KeyDiffAnchor::kRawMean}) {
    for (int64_t T : {50, 257}) {
      for (int64_t N : {8, 32}) {
        for (int64_t B : {1, 7, 32, 128}) {
          for (double x : {0.0, 0.2}) {
            const int64_t d = 12;
            const std::vector<float> keys = HeadKeys(T, d, T * 1000 + N * 10 + B);
            absl::StatusOr<KeyDiffBlockResult> r =
                RunKeyDiffBlocks(keys.data(), T, d, Options(N, B, anchor, x));
            ASSERT_TRUE(r.ok()) << r.status();
            EXPECT_EQ(r->kept, ko::BlockSelect(ToMatrix(keys, T, d), N, B, OracleMode(anchor), x))
                << "raw=" << (anchor == KeyDiffAnchor::kRawMean) << " T=" << T << " N=" << N
                << " B=" << B << " x=" << x;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 64);
}

// ---- Conformance 5: the sliding window -------------------------------------------------------

TEST(KeyDiffBlock, RecentShareRoundsHalfUpAndDecidesTheKeptSet) {
  // T = 20 keys along e0, except tokens 2, 6, 10, 14 along e1..e4 (the least similar to the
  // anchor, tied, so ranked by index). N = 5, x = 0.3: R = round(1.5) = 2 protects 18 and 19
  // and leaves 3 slots: {2, 6, 10}. The spec's floor (R = 1) would keep {2, 6, 10, 14, 19}.
  const int64_t T = 20, d = 8;
  std::vector<float> keys(static_cast<size_t>(T * d), 0.0f);
  for (int64_t j = 0; j < T; ++j) keys[j * d] = 1.0f;
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t j = 2 + 4 * i;
    keys[j * d] = 0.0f;
    keys[j * d + 1 + i] = 1.0f;
  }
  absl::StatusOr<KeyDiffBlockResult> r =
      RunKeyDiffBlocks(keys.data(), T, d, Options(5, T, KeyDiffAnchor::kNormalizedMean, 0.3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kept, (std::vector<int64_t>{2, 6, 10, 18, 19}));
}

TEST(KeyDiffBlock, RecentWindowIsAlwaysRetained) {
  for (double x : {0.1, 0.2, 0.5, 1.0}) {
    for (int64_t B : {1, 5, 64}) {
      const int64_t T = 400, N = 50, d = 8;
      const int64_t R = static_cast<int64_t>(std::floor(x * N + 0.5));  // round half up
      const std::vector<float> keys = HeadKeys(T, d, 11 + B);
      auto observer = [&](const KeyDiffBlockStep& s) {
        const std::set<int64_t> cache(s.positions, s.positions + s.size_after);
        for (int64_t p = std::max<int64_t>(0, s.tokens_seen - R); p < s.tokens_seen; ++p) {
          ASSERT_TRUE(cache.count(p))
              << "x=" << x << " B=" << B << " step " << s.step << " lost recent position " << p;
        }
      };
      absl::StatusOr<KeyDiffBlockResult> r = RunKeyDiffBlocks(
          keys.data(), T, d, Options(N, B, KeyDiffAnchor::kNormalizedMean, x), observer);
      ASSERT_TRUE(r.ok()) << r.status();
      if (R == N) {  // x = 1: a pure sliding window
        std::vector<int64_t> last;
        for (int64_t p = T - N; p < T; ++p) last.push_back(p);
        EXPECT_EQ(r->kept, last);
      }
    }
  }
}

TEST(KeyDiffBlock, WithoutAWindowOldDistinctiveKeysSurvive) {
  // Plain KeyDiff keeps an early outlier key forever, which a sliding window would drop;
  // guards against the window being applied when x = 0.
  const int64_t T = 200, N = 20, d = 4;
  std::vector<float> keys(T * d, 0.0f);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int64_t j = 0; j < T; ++j) {
    keys[j * d] = 1.0f + normal(rng);
    for (int64_t c = 1; c < d; ++c) keys[j * d + c] = normal(rng);
  }
  keys[3 * d + 0] = -1.0f;  // position 3 points away from everything else
  absl::StatusOr<KeyDiffBlockResult> r = RunKeyDiffBlocks(keys.data(), T, d, Options(N, 16));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(std::binary_search(r->kept.begin(), r->kept.end(), int64_t{3}));
}

// ---- Rule 1: ties keep the lower original position -------------------------------------------

TEST(KeyDiffBlock, EqualScoresKeepTheLowerPosition) {
  const int64_t T = 90, N = 10, d = 3;
  std::vector<float> keys;
  for (int64_t j = 0; j < T; ++j) keys.insert(keys.end(), {1.0f, 2.0f, -0.5f});  // all equal
  for (int64_t B : {1, 4, 90}) {
    absl::StatusOr<KeyDiffBlockResult> r = RunKeyDiffBlocks(keys.data(), T, d, Options(N, B));
    ASSERT_TRUE(r.ok());
    std::vector<int64_t> first(N);
    for (int64_t i = 0; i < N; ++i) first[i] = i;
    EXPECT_EQ(r->kept, first) << "B=" << B;
    // With a 30% window: the 7 lowest positions plus the 3 newest.
    r = RunKeyDiffBlocks(keys.data(), T, d, Options(N, B, KeyDiffAnchor::kNormalizedMean, 0.3));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->kept, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 87, 88, 89})) << "B=" << B;
  }
}

// ---- Edge cases and argument checks ----------------------------------------------------------

TEST(KeyDiffBlock, ShortSequencesAreKeptWhole) {
  const std::vector<float> keys = HeadKeys(5, 4, 1);
  absl::StatusOr<KeyDiffBlockResult> r = RunKeyDiffBlocks(keys.data(), 5, 4, Options(8, 2));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kept, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(r->num_evicted, 0);
  EXPECT_EQ(r->max_cache_size, 5);
  r = RunKeyDiffBlocks(nullptr, 0, 4, Options(8, 2));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->kept.empty());
  EXPECT_EQ(r->num_steps, 0);
}

TEST(KeyDiffBlock, RejectsInvalidOptions) {
  const std::vector<float> keys = HeadKeys(10, 2, 1);
  struct Bad {
    KeyDiffBlockOptions options;
    const float* keys;
    int64_t d;
    std::string fragment;
  };
  KeyDiffBlockOptions eps_negative = Options(4, 2);
  eps_negative.eps = -1e-8f;
  const std::vector<Bad> cases = {
      {Options(0, 2), keys.data(), 2, "budget must be >= 1"},
      {Options(4, 0), keys.data(), 2, "block_size must be >= 1"},
      {Options(4, 2, KeyDiffAnchor::kNormalizedMean, 1.5), keys.data(), 2, "recent_fraction"},
      {Options(4, 2, KeyDiffAnchor::kNormalizedMean, -0.1), keys.data(), 2, "recent_fraction"},
      {eps_negative, keys.data(), 2, "eps must be >= 0"},
      {Options(4, 2), keys.data(), 0, "head_dim must be >= 1"},
      {Options(4, 2), nullptr, 2, "keys is null"},
  };
  for (const Bad& c : cases) {
    absl::StatusOr<KeyDiffBlockResult> r = RunKeyDiffBlocks(c.keys, 10, c.d, c.options);
    ASSERT_FALSE(r.ok()) << c.fragment;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.fragment;
    EXPECT_NE(r.status().message().find(c.fragment), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace kvtrim
