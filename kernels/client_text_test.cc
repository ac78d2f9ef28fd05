// Tests of the bounded quoting of client strings and the exact printing of numbers.
#include "kernels/client_text.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace kvtrim {
namespace {

TEST(QuoteClientTextTest, ShortTextIsQuotedWhole) {
  EXPECT_EQ(QuoteClientText("dropkv"), "'dropkv'");
  EXPECT_EQ(QuoteClientText(""), "''");
}

TEST(QuoteClientTextTest, LongTextIsAPrefixAndItsLength) {
  const std::string name(20000, 'x');
  const std::string quoted = QuoteClientText(name);
  EXPECT_EQ(quoted, "'" + std::string(kQuotedPrefixBytes, 'x') + "...' (20000 bytes)");
  EXPECT_EQ(QuoteClientText("abcdef", 3), "'abc...' (6 bytes)");
}

TEST(QuoteClientTextTest, ControlAndNonAsciiBytesAreEscaped) {
  EXPECT_EQ(QuoteClientText(std::string("a\nb\x01'\xff", 6)), "'a\\nb\\x01\\'\\xff'");
}

TEST(ClientTextInFieldTest, BoundsNamesInsideFieldPaths) {
  EXPECT_EQ(ClientTextInField("window"), "window");
  EXPECT_EQ(ClientTextInField(std::string(100, 'p'), 4), "pppp...(100 bytes)");
}

TEST(ExactNumberTest, PrintsTheShortestRoundTrip) {
  EXPECT_EQ(ExactNumber(1.0000000000000002), "1.0000000000000002");
  EXPECT_EQ(ExactNumber(1048576), "1048576");
  EXPECT_EQ(ExactNumber(0.2), "0.2");
  EXPECT_EQ(ExactNumber(1e300), "1e+300");
  EXPECT_EQ(ExactNumber(-0.5), "-0.5");
  EXPECT_EQ(ExactNumber(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(ExactNumber(-std::numeric_limits<double>::infinity()), "-inf");
}

}  // namespace
}  // namespace kvtrim
