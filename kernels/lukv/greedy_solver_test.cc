// lukv.md §9 items 5-9 on random small instances: GREEDY == exact DP on the relaxed
// curves, the relaxation lower bound, near-exactness on the raw objective, nestedness and
// budget conservation; plus the grid helpers of §5.1.
#include "kernels/lukv/greedy_solver.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "kernels/lukv/dp_oracle.h"
#include "kernels/lukv/loss_curves.h"
#include "kernels/lukv/lukv_test_util.h"
#include "kernels/lukv/pava.h"

namespace kvtrim::lukv {
namespace {

using testing::RandomHead;

/// Raw curves f, hull gains ĝ, relaxed curves f̆ and hull vertices of random heads.
struct Instance {
  std::vector<std::vector<double>> raw, gains, relaxed;
  std::vector<std::set<int64_t>> vertices;
  Instance(int64_t heads, int64_t T, std::mt19937& rng) {
    for (int64_t h = 0; h < heads; ++h) {
      RandomHead head(T, rng, 0.3 + 0.3 * static_cast<double>(h % 4));
      raw.push_back(RawLossCurve(head.d));
      gains.push_back(AntitonicPava(head.d));
      relaxed.push_back(SurrogateCurve(raw.back()[0], gains.back()));
      const std::vector<int64_t> v = LowerHullVertices(raw.back());
      vertices.emplace_back(v.begin(), v.end());
    }
  }
  /// max_h max_i f(i) - f̆(i).
  double MaxHullGap() const {
    double gap = 0;
    for (size_t h = 0; h < raw.size(); ++h) {
      for (size_t i = 0; i < raw[h].size(); ++i) gap = std::max(gap, raw[h][i] - relaxed[h][i]);
    }
    return gap;
  }
};

std::vector<int64_t> AllBudgets(int64_t total) {
  std::vector<int64_t> b(static_cast<size_t>(total + 1));
  std::iota(b.begin(), b.end(), 0);
  return b;
}

// The "done when": 6 heads, T = 12, every B.
TEST(LukvGreedyTest, GreedyEqualsDpOnRelaxedCurves) {  // §9 item 5
  std::mt19937 rng(21);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t heads = 6, T = 12;
    Instance inst(heads, T, rng);
    const auto alloc = GreedyAllocate(inst.gains, 0, AllBudgets(heads * T));
    for (int64_t B = 0; B <= heads * T; ++B) {
      const std::vector<int64_t>& a = alloc[static_cast<size_t>(B)];
      ASSERT_EQ(std::accumulate(a.begin(), a.end(), int64_t{0}), B);
      const DpSolution dp = SolveMckpExact(inst.relaxed, B);
      ASSERT_TRUE(dp.feasible);
      EXPECT_NEAR(CurvesValue(inst.relaxed, a), dp.value, 1e-9) << "trial " << trial << " B " << B;
    }
  }
}

TEST(LukvGreedyTest, GreedyEqualsDpWithRetentionFloor) {
  std::mt19937 rng(22);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t heads = 5, T = 10, floor = 1 + trial % 3;
    Instance inst(heads, T, rng);
    const auto alloc = GreedyAllocate(inst.gains, floor, AllBudgets(heads * T));
    for (int64_t B = heads * floor; B <= heads * T; ++B) {
      const std::vector<int64_t>& a = alloc[static_cast<size_t>(B)];
      for (int64_t x : a) EXPECT_GE(x, floor);
      const DpSolution dp = SolveMckpExact(inst.relaxed, B, floor);
      ASSERT_TRUE(dp.feasible);
      EXPECT_NEAR(CurvesValue(inst.relaxed, a), dp.value, 1e-9) << "B " << B;
    }
  }
}

TEST(LukvGreedyTest, RelaxationIsALowerBound) {  // §9 item 6
  std::mt19937 rng(23);
  for (int trial = 0; trial < 20; ++trial) {
    Instance inst(6, 12, rng);
    for (int64_t B = 0; B <= 72; ++B) {
      EXPECT_LE(SolveMckpExact(inst.relaxed, B).value,
                SolveMckpExact(inst.raw, B).value + 1e-12);
    }
  }
}

TEST(LukvGreedyTest, NearExactOnRawObjective) {  // §9 item 7
  std::mt19937 rng(24);
  int exact_cases = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t heads = 6, T = 12;
    Instance inst(heads, T, rng);
    const double bound = inst.MaxHullGap();
    const auto alloc = GreedyAllocate(inst.gains, 0, AllBudgets(heads * T));
    for (int64_t B = 0; B <= heads * T; ++B) {
      const std::vector<int64_t>& a = alloc[static_cast<size_t>(B)];
      const double greedy = CurvesValue(inst.raw, a);
      const double dp = SolveMckpExact(inst.raw, B).value;
      EXPECT_GE(greedy, dp - 1e-9);
      EXPECT_LE(greedy - dp, bound + 1e-9) << "trial " << trial << " B " << B;
      // At most one head ends strictly inside a hull segment.
      int inside = 0;
      for (int64_t h = 0; h < heads; ++h) inside += inst.vertices[h].count(a[h]) == 0;
      EXPECT_LE(inside, 1) << "trial " << trial << " B " << B;
      if (inside == 0) {  // B lands on hull vertices: the greedy is exact on the raw curves
        EXPECT_NEAR(greedy, dp, 1e-9) << "trial " << trial << " B " << B;
        ++exact_cases;
      }
    }
  }
  EXPECT_GT(exact_cases, 0);
}

TEST(LukvGreedyTest, GridHelpers) {
  EXPECT_DOUBLE_EQ(GridRatio(0), 0.01);
  EXPECT_DOUBLE_EQ(GridRatio(98), 0.99);
  EXPECT_EQ(RetentionFloor(1), 1);
  EXPECT_EQ(RetentionFloor(100), 1);
  EXPECT_EQ(RetentionFloor(101), 2);
  EXPECT_EQ(RetentionFloor(200), 2);
  EXPECT_EQ(RetentionFloor(0), 0);
  // B(0.5) for 2 heads * 5 tokens = 5; B(0.25) = round(7.5) = 8 (half up).
  EXPECT_EQ(GridBudget(49, 2, 5), 5);
  EXPECT_EQ(GridBudget(24, 2, 5), 8);
}

TEST(LukvGreedyTest, NestedAndConserved) {  // §9 items 8 and 9 for one query
  std::mt19937 rng(25);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t L = 1 + trial % 3, H = 1 + trial % 4, T = 5 + 17 * trial;
    std::vector<std::vector<double>> d;
    for (int64_t i = 0; i < L * H; ++i) d.push_back(RandomHead(T, rng).d);
    const std::vector<double> r = SolveLocalRatios(d, L, H);
    ASSERT_EQ(r.size(), static_cast<size_t>(kGridRows * L * H));
    const int64_t heads = L * H, floor = RetentionFloor(T);
    for (int row = 0; row < kGridRows; ++row) {
      double mean = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const double x = r[row * heads + h];
        EXPECT_LE(x, 1.0 - static_cast<double>(floor) / static_cast<double>(T) + 1e-12);
        EXPECT_GE(x, 0.0);
        if (row > 0) {
          EXPECT_GE(x, r[(row - 1) * heads + h]);  // nested in ρ
        }
        mean += x / static_cast<double>(heads);
      }
      EXPECT_NEAR(mean, GridRatio(row), 1.0 / static_cast<double>(T)) << "row " << row;
      // Exact when the budget exceeds the floor: Σ alloc = B(ρ).
      const int64_t B = GridBudget(row, heads, T);
      const double kept = (1.0 - mean) * static_cast<double>(heads * T);
      EXPECT_NEAR(kept, static_cast<double>(std::max(B, heads * floor)), 1e-6);
    }
  }
}

TEST(LukvDpTest, InfeasibleAndTrivial) {
  const std::vector<std::vector<double>> curves{{3, 0.5, 0}, {2, 0}};
  EXPECT_FALSE(SolveMckpExact(curves, 4).feasible);
  EXPECT_FALSE(SolveMckpExact(curves, 1, 1).feasible);
  const DpSolution s = SolveMckpExact(curves, 1);
  ASSERT_TRUE(s.feasible);
  EXPECT_EQ(s.value, 2.5);  // head 0 keeps one: 0.5 + 2; head 1 keeps one: 3 + 0
  EXPECT_EQ(s.alloc, (std::vector<int64_t>{1, 0}));
}

}  // namespace
}  // namespace kvtrim::lukv
