// lukv.md §9 items 1, 2 and 4: the raw loss curve, the convexity criterion and the
// convex-hull surrogate (PAVA on the gains == lower hull of the loss curve).
#include "kernels/lukv/pava.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/lukv/loss_curves.h"
#include "kernels/lukv/lukv_test_util.h"

namespace kvtrim::lukv {
namespace {

using testing::RandomHead;

constexpr double kTol = 1e-12;

TEST(LukvPavaTest, MonotoneLossCurve) {  // §9 item 1
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t T = 1 + trial % 40;
    RandomHead head(T, rng);
    const std::vector<double> f = RawLossCurve(head.d);
    ASSERT_EQ(f.size(), static_cast<size_t>(T + 1));
    const double total = std::accumulate(head.importance.begin(), head.importance.end(), 0.0);
    EXPECT_NEAR(f[0], total, kTol * (1 + total));
    EXPECT_EQ(f[T], 0.0);
    for (int64_t i = 1; i <= T; ++i) {
      EXPECT_LE(f[i], f[i - 1]);
      EXPECT_NEAR(f[i - 1] - f[i], head.d[i - 1], kTol * (1 + total));
    }
  }
}

TEST(LukvPavaTest, ConvexityCriterion) {  // §9 item 2
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> small(0, 9);
  std::normal_distribution<double> noise(0.0, 2.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t T = 2 + trial % 30;
    // Integer importance: every sum is exact, so convexity can be tested exactly.
    std::vector<double> importance(static_cast<size_t>(T)), scores(importance.size());
    for (size_t j = 0; j < importance.size(); ++j) {
      importance[j] = small(rng);
      scores[j] = importance[j] + (trial % 2 ? noise(rng) : 0.0);
    }
    const std::vector<double> d =
        OrderedGains(importance.data(), DescendingOrder(scores.data(), T));
    const std::vector<double> f = RawLossCurve(d);
    bool f_convex = true;
    for (int64_t i = 1; i < T; ++i) f_convex &= f[i - 1] - 2 * f[i] + f[i + 1] >= 0;
    const bool d_non_increasing = std::is_sorted(d.rbegin(), d.rend());
    EXPECT_EQ(f_convex, d_non_increasing);
    // d non-increasing <=> π ranks like I (equal I-values may swap).
    const std::vector<double> d_star =
        OrderedGains(importance.data(), DescendingOrder(importance.data(), T));
    EXPECT_EQ(d_non_increasing, d == d_star);
    // π = π*: the hull is a no-op (f̆ = f); otherwise PAVA changes the gains.
    const std::vector<double> f_star = RawLossCurve(d_star);
    EXPECT_EQ(AntitonicPava(d_star), d_star);
    EXPECT_EQ(SurrogateCurve(f_star[0], LowerHullGains(f_star)), f_star);
    if (!d_non_increasing) {
      EXPECT_NE(AntitonicPava(d), d);
    }
  }
}

TEST(LukvPavaTest, HullSurrogateProperties) {  // §9 item 4
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t T = 1 + trial % 50;
    RandomHead head(T, rng, 0.5 + trial % 3);
    const std::vector<double> f = RawLossCurve(head.d);
    const std::vector<double> g = AntitonicPava(head.d);
    ASSERT_EQ(g.size(), head.d.size());
    for (int64_t i = 0; i < T; ++i) {
      EXPECT_GE(g[i], 0.0);
      if (i > 0) {
        EXPECT_LE(g[i], g[i - 1]);  // exactly non-increasing
      }
    }
    const double sum_g = std::accumulate(g.begin(), g.end(), 0.0);
    const double sum_d = std::accumulate(head.d.begin(), head.d.end(), 0.0);
    EXPECT_NEAR(sum_g, sum_d, 1e-10 * (1 + sum_d));
    const std::vector<double> f_hull = SurrogateCurve(f[0], g);
    const double tol = 1e-10 * (1 + f[0]);
    for (int64_t i = 0; i <= T; ++i) EXPECT_LE(f_hull[i], f[i] + tol) << "i=" << i;
    EXPECT_EQ(f_hull[0], f[0]);
    EXPECT_NEAR(f_hull[T], 0.0, tol);
    for (int64_t v : LowerHullVertices(f)) EXPECT_NEAR(f_hull[v], f[v], tol) << "vertex " << v;
  }
}

TEST(LukvPavaTest, PavaEqualsLowerHull) {  // §9 item 4, third bullet
  std::mt19937 rng(4);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t T = 1 + trial % 64;
    RandomHead head(T, rng, 0.2 + 0.1 * (trial % 20));
    const std::vector<double> f = RawLossCurve(head.d);
    const std::vector<double> g_pava = AntitonicPava(head.d);
    const std::vector<double> g_hull = LowerHullGains(f);
    ASSERT_EQ(g_pava.size(), g_hull.size());
    for (int64_t i = 0; i < T; ++i) EXPECT_NEAR(g_pava[i], g_hull[i], 1e-10) << "i=" << i;
    const std::vector<double> a = SurrogateCurve(f[0], g_pava);
    const std::vector<double> b = SurrogateCurve(f[0], g_hull);
    for (int64_t i = 0; i <= T; ++i) EXPECT_NEAR(a[i], b[i], 1e-10) << "i=" << i;
  }
}

TEST(LukvPavaTest, KnownExample) {
  // d = 1, 3, 2, 0: pools {1, 3, 2} -> 2, then 0.
  EXPECT_EQ(AntitonicPava({1, 3, 2, 0}), (std::vector<double>{2, 2, 2, 0}));
  EXPECT_EQ(AntitonicPava({}), std::vector<double>{});
  const std::vector<double> f = RawLossCurve({1, 3, 2, 0});  // 6, 5, 2, 0, 0
  EXPECT_EQ(f, (std::vector<double>{6, 5, 2, 0, 0}));
  EXPECT_EQ(LowerHullVertices(f), (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(LowerHullGains(f), (std::vector<double>{2, 2, 2, 0}));
}

}  // namespace
}  // namespace kvtrim::lukv
