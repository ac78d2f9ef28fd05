// lukv.md §9 item 3: the optimality gap Δ(π, b) of Eq. 7.
#include "kernels/lukv/loss_curves.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "kernels/lukv/lukv_test_util.h"

namespace kvtrim::lukv {
namespace {

using testing::RandomHead;

TEST(LukvGapTest, GapIsNonNegativeAndMatchesLossDifference) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t T = 1 + trial % 40;
    RandomHead head(T, rng);
    const std::vector<double> f_pi = RawLossCurve(head.d);
    const std::vector<double> f_star =
        RawLossCurve(OrderedGains(head.importance.data(), head.order_star));
    for (int64_t b = 0; b <= T; ++b) {
      const GapResult gap = OptimalityGap(head.importance, head.order_pi, head.order_star, b);
      EXPECT_EQ(gap.num_miss, gap.num_fp);
      EXPECT_GE(gap.delta, -1e-12);
      // 𝓛(P) = 𝓛(O) + Δ, and 𝓛(M^π(b)) >= 𝓛(M^π*(b)).
      EXPECT_NEAR(f_pi[b], f_star[b] + gap.delta, 1e-9);
      EXPECT_GE(f_pi[b], f_star[b] - 1e-12);
      // Δ = 0 iff the two top-b sets carry equal I-mass.
      double mass_p = 0, mass_o = 0;
      for (int64_t i = 0; i < b; ++i) {
        mass_p += head.importance[head.order_pi[i]];
        mass_o += head.importance[head.order_star[i]];
      }
      EXPECT_EQ(std::abs(gap.delta) < 1e-12, std::abs(mass_p - mass_o) < 1e-12);
    }
  }
}

TEST(LukvGapTest, OracleOrderHasNoGap) {
  std::mt19937 rng(12);
  RandomHead head(25, rng);
  for (int64_t b = 0; b <= 25; ++b) {
    const GapResult gap = OptimalityGap(head.importance, head.order_star, head.order_star, b);
    EXPECT_EQ(gap.delta, 0.0);
    EXPECT_EQ(gap.num_miss, 0);
  }
}

TEST(LukvGapTest, DescendingOrderIsStableAndPutsInfinityFirst) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> s{1, inf, 3, 1, inf, 3};
  EXPECT_EQ(DescendingOrder(s.data(), 6), (std::vector<int32_t>{1, 4, 2, 5, 0, 3}));
}

}  // namespace
}  // namespace kvtrim::lukv
