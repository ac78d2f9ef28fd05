#include "kernels/budget.h"

#include <gtest/gtest.h>

namespace kvtrim {
namespace {

Budget Fraction(double f) { return Budget{true, f, 0}; }
Budget Tokens(int64_t k) { return Budget{false, 0, k}; }

TEST(Budget, FractionRoundsHalfUpWithFloorOfOne) {
  EXPECT_EQ(KeptCount(Fraction(0.5), 5), 3);   // 2.5 -> 3
  EXPECT_EQ(KeptCount(Fraction(0.2), 256), 51);  // 51.2 -> 51
  EXPECT_EQ(KeptCount(Fraction(0.3), 5), 2);   // 1.5 -> 2
  EXPECT_EQ(KeptCount(Fraction(0.01), 10), 1); // 0.1 -> 0 -> floor 1
  EXPECT_EQ(KeptCount(Fraction(1.0), 7), 7);
  EXPECT_EQ(KeptCount(Fraction(0.5), 1), 1);
}

TEST(Budget, TokensClampToN) {
  EXPECT_EQ(KeptCount(Tokens(4), 10), 4);
  EXPECT_EQ(KeptCount(Tokens(40), 10), 10);
}

TEST(Budget, ProtectionCountsInsideTheBudget) {
  // Rule 3: s + r >= k keeps min(s, k) sinks and k - min(s, k) most recent tokens.
  Protection p = ClampProtection({4, 32}, 10, 100);
  EXPECT_EQ(p.sink, 4);
  EXPECT_EQ(p.recent, 6);
  p = ClampProtection({12, 32}, 10, 100);
  EXPECT_EQ(p.sink, 10);
  EXPECT_EQ(p.recent, 0);
  p = ClampProtection({2, 3}, 10, 100);
  EXPECT_EQ(p.sink, 2);
  EXPECT_EQ(p.recent, 3);
}

}  // namespace
}  // namespace kvtrim
