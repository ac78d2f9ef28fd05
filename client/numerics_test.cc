// Tests of the client tools' spelling of the numerics mode.
#include "client/numerics.h"

#include <gtest/gtest.h>

namespace kvtrim {
namespace {

TEST(NumericsFlagTest, ParsesEveryModeAndEmptyAsTheServerDefault) {
  EXPECT_EQ(*ParseNumericsFlag(""), v1::NUMERICS_UNSPECIFIED);
  EXPECT_EQ(*ParseNumericsFlag("fast"), v1::NUMERICS_FAST);
  EXPECT_EQ(*ParseNumericsFlag("exact"), v1::NUMERICS_EXACT);
  const absl::Status bad = ParseNumericsFlag("EXACT").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--numerics: \"EXACT\" is not fast or exact"),
            std::string::npos)
      << bad;
}

TEST(NumericsFlagTest, LabelsRoundTripThroughTheParser) {
  for (v1::Numerics mode : {v1::NUMERICS_FAST, v1::NUMERICS_EXACT}) {
    EXPECT_EQ(*ParseNumericsFlag(NumericsLabel(mode)), mode);
  }
  EXPECT_STREQ(NumericsLabel(v1::NUMERICS_UNSPECIFIED), "default");
  EXPECT_STREQ(NumericsLabel(static_cast<v1::Numerics>(42)), "unknown");
}

}  // namespace
}  // namespace kvtrim
