#include "base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvtrim {
namespace {

TEST(DType, Bf16RoundTripIsExactForRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 0.15625f, 3.0e38f, -1.0e-30f}) {
    const float r = RoundToBf16(v);
    EXPECT_EQ(RoundToBf16(r), r) << v;  // idempotent
    EXPECT_NEAR(r, v, std::fabs(v) / 128.0f) << v;
  }
  EXPECT_EQ(RoundToBf16(1.0f + 1.0f / 256.0f), 1.0f);  // tie rounds to even
  EXPECT_EQ(RoundToBf16(1.0f + 3.0f / 256.0f), 1.0f + 4.0f / 256.0f);
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(DType, F16ConversionMatchesKnownBitPatterns) {
  EXPECT_EQ(F16ToFloat(0x3C00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xC000), -2.0f);
  EXPECT_EQ(F16ToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(F16ToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7E00)));
  EXPECT_EQ(FloatToF16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToF16(1.0e6f), 0x7C00);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);
  // Every finite half survives half -> float -> half.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7C00) == 0x7C00) continue;
    EXPECT_EQ(FloatToF16(F16ToFloat(static_cast<uint16_t>(bits))), bits) << bits;
  }
}

TEST(DType, ConvertToF32HandlesEveryDtype) {
  const uint16_t bf16[2] = {FloatToBf16(1.5f), FloatToBf16(-3.0f)};
  const uint16_t f16[2] = {FloatToF16(0.25f), FloatToF16(-8.0f)};
  float out[2];
  ConvertToF32(DType::kBF16, bf16, 2, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -3.0f);
  ConvertToF32(DType::kF16, f16, 2, out);
  EXPECT_EQ(out[0], 0.25f);
  EXPECT_EQ(out[1], -8.0f);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
}

}  // namespace
}  // namespace kvtrim
