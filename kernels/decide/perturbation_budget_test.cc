// The max_perturbation bisection (perturbation_budget.h) on fake statistics: monotone and
// not, the cap, epsilon 0, the protected floor, bad bounds; and the rankings' prefixes.
#include "kernels/decide/perturbation_budget.h"
#include "kernels/decide/perturbation_budget_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace kvtrim {
namespace {

/// An evaluator from one fake E per head; counts every call's counts in `calls`.
CountEvaluator Fake(const std::vector<HeadE>& heads, std::vector<std::vector<int64_t>>* calls) {
  return [heads, calls](const std::vector<int64_t>& counts, std::vector<double>* values) {
    if (calls != nullptr) calls->push_back(counts);
    for (size_t h = 0; h < heads.size(); ++h) (*values)[h] = heads[h](counts[h]);
    return absl::OkStatus();
  };
}

TEST(BisectKeptCountsTest, MonotoneGivesTheSmallestKWithinEpsilon) {
  // E_h(k) = scale_h / k: decreasing, so the answer is the smallest k with E <= epsilon.
  const std::vector<double> scales = {1.0, 3.0, 0.25, 10.0};
  std::vector<HeadE> heads;
  for (double s : scales) heads.push_back([s](int64_t k) { return s / static_cast<double>(k); });
  const double epsilon = 0.1;
  const std::vector<int64_t> k_min(4, 2), k_cap(4, 60);
  std::vector<std::vector<int64_t>> calls;
  auto found = BisectKeptCounts(k_min, k_cap, epsilon, Fake(heads, &calls));
  ASSERT_TRUE(found.ok()) << found.status();
  for (size_t h = 0; h < scales.size(); ++h) {
    int64_t smallest = k_cap[h];
    for (int64_t k = k_min[h]; k <= k_cap[h]; ++k) {
      if (heads[h](k) <= epsilon) {
        smallest = k;
        break;
      }
    }
    EXPECT_EQ(found->kept[h], smallest) << "head " << h;
    EXPECT_EQ(found->perturbation[h], heads[h](found->kept[h])) << "head " << h;
  }
  // Head 3 never reaches epsilon (10/60 > 0.1): capped, its E(k_cap) reported.
  EXPECT_EQ(found->kept[3], 60);
  EXPECT_GT(found->perturbation[3], epsilon);
  // First call at the cap for every head, then about log2(59) steps, heads together.
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls[0], k_cap);
  EXPECT_EQ(found->evaluations, static_cast<int32_t>(calls.size()));
  EXPECT_LE(found->evaluations, 1 + 6);  // ceil(log2(60 - 2 + 1)) = 6
}

TEST(BisectKeptCountsTest, NonMonotoneFollowsTheRuleAndStaysWithinEpsilon) {
  // Bumpy statistics: the bisection's answer is the rule's, not the global smallest, and its
  // E is <= epsilon unless capped.
  std::vector<HeadE> heads = {
      [](int64_t k) { return 0.5 + 0.4 * std::sin(0.7 * static_cast<double>(k)) / std::sqrt(k); },
      [](int64_t k) { return (k % 3 == 0) ? 0.05 : 0.6 / static_cast<double>(k); },
      [](int64_t k) { return k < 20 ? 0.01 : (k < 30 ? 0.9 : 0.02); },
  };
  for (double epsilon : {0.0, 0.03, 0.08, 0.5, 2.0}) {
    const std::vector<int64_t> k_min(3, 1), k_cap(3, 41);
    auto found = BisectKeptCounts(k_min, k_cap, epsilon, Fake(heads, nullptr));
    ASSERT_TRUE(found.ok()) << found.status();
    for (size_t h = 0; h < heads.size(); ++h) {
      EXPECT_EQ(found->kept[h], ReferenceK(heads[h], 1, 41, epsilon))
          << "head " << h << " epsilon " << epsilon;
      EXPECT_EQ(found->perturbation[h], heads[h](found->kept[h]));
      if (found->kept[h] < 41) EXPECT_LE(found->perturbation[h], epsilon);
    }
  }
}

TEST(BisectKeptCountsTest, CapReachedKeepsTheCapAndItsStatistic) {
  auto found = BisectKeptCounts({3}, {17}, 0.01, Fake({[](int64_t) { return 0.5; }}, nullptr));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->kept[0], 17);
  EXPECT_EQ(found->perturbation[0], 0.5);
  EXPECT_EQ(found->evaluations, 1);  // above epsilon at the cap: no search
}

TEST(BisectKeptCountsTest, EpsilonZeroNeedsAnExactlyUnchangedOutput) {
  // E = 0 from k = 9 on: epsilon 0 finds 9; E > 0 everywhere below the cap: the cap.
  auto zero_from_9 = [](int64_t k) { return k >= 9 ? 0.0 : 1e-12; };
  auto found = BisectKeptCounts({1, 1}, {30, 30}, 0.0,
                                Fake({zero_from_9, [](int64_t k) {
                                        return k == 30 ? 0.0 : 1e-9;
                                      }},
                                     nullptr));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->kept[0], 9);
  EXPECT_EQ(found->kept[1], 30);
  EXPECT_EQ(found->perturbation[1], 0.0);
}

TEST(BisectKeptCountsTest, TheProtectedFloorIsTheLeastKept) {
  // Every k is within epsilon: each head keeps its floor k_min (its protected count).
  std::vector<std::vector<int64_t>> calls;
  auto found = BisectKeptCounts({5, 1, 12}, {40, 40, 12}, 1.0,
                                Fake({[](int64_t) { return 0.0; }, [](int64_t) { return 0.5; },
                                      [](int64_t) { return 0.0; }},
                                     &calls));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->kept, (std::vector<int64_t>{5, 1, 12}));
  for (const auto& counts : calls) {
    EXPECT_GE(counts[0], 5);
    EXPECT_EQ(counts[2], 12);  // k_min = k_cap: never searched below
  }
}

TEST(BisectKeptCountsTest, NaNCountsAsAboveEpsilon) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto found = BisectKeptCounts({1}, {8}, 0.5,
                                Fake({[nan](int64_t k) { return k < 6 ? nan : 0.1; }}, nullptr));
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->kept[0], 6);
  auto capped = BisectKeptCounts({1}, {8}, 0.5, Fake({[nan](int64_t) { return nan; }}, nullptr));
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->kept[0], 8);
}

TEST(BisectKeptCountsTest, BadBoundsAndEvaluatorErrors) {
  auto none = Fake({[](int64_t) { return 0.0; }}, nullptr);
  EXPECT_EQ(BisectKeptCounts({0}, {4}, 0.1, none).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BisectKeptCounts({5}, {4}, 0.1, none).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BisectKeptCounts({1, 1}, {4}, 0.1, none).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto failing = [](const std::vector<int64_t>&, std::vector<double>*) {
    return absl::ResourceExhaustedError("arena");
  };
  EXPECT_EQ(BisectKeptCounts({1}, {4}, 0.1, failing).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(RankHeadsTest, ProtectedFirstThenScoreThenLowerIndex) {
  LayerScores layer;
  layer.num_heads = 2;
  layer.num_tokens = 6;
  layer.scores = {0.5f, 0.9f, 0.9f, 0.1f, 0.3f, 0.2f,   // head 0
                  1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // head 1
  layer.budget.protection = {1, 1};                      // token 0 and token 5 protected
  const std::vector<int32_t> ranking = RankHeads(layer, 4);
  EXPECT_EQ(ranking, (std::vector<int32_t>{0, 5, 1, 2,  // ties 0.9: token 1 before 2
                                           0, 5, 4, 3}));
  std::vector<int64_t> offsets;
  std::vector<int32_t> indices;
  PrefixLists(ranking, 4, {3, 4}, &offsets, &indices);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 3, 7}));
  EXPECT_EQ(indices, (std::vector<int32_t>{0, 1, 5, 0, 3, 4, 5}));  // ascending per head
}

}  // namespace
}  // namespace kvtrim
