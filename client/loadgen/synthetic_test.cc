// Tests of the load generator's synthetic data: dtype conversions, determinism, layout.
#include "client/loadgen/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvtrim::loadgen {
namespace {

TEST(ConvertTest, Bf16IsTheRoundedUpperHalf) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  // 1 + 2^-8 lies half way between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);
  // Just above half way rounds up.
  EXPECT_EQ(FloatToBf16(std::nextafter(1.00390625f, 2.0f)), 0x3f81);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::quiet_NaN()) & 0x7f80, 0x7f80);
  EXPECT_NE(FloatToBf16(std::numeric_limits<float>::quiet_NaN()) & 0x007f, 0);
}

TEST(ConvertTest, F16RoundsToNearestEven) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(0.5f), 0x3800);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(FloatToF16(65536.0f), 0x7c00);               // overflow: infinity
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);               // half way to 65536 rounds to even: inf
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -26)), 0x0000);  // underflow
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie to even
  EXPECT_EQ(FloatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(FloatToF16(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
}

TEST(NormalSamplesTest, DeterministicAndRoughlyStandardNormal) {
  const std::vector<float> a = NormalSamples(42, 20001);
  const std::vector<float> b = NormalSamples(42, 20001);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, NormalSamples(43, 20001));
  double sum = 0, squares = 0;
  for (float x : a) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double mean = sum / a.size();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(squares / a.size() - mean * mean, 1.0, 0.05);
}

TEST(EncodeAsTest, LittleEndianElementBytes) {
  const std::string f32 = EncodeAs(v1::DTYPE_F32, {1.0f});
  EXPECT_EQ(f32, std::string("\x00\x00\x80\x3f", 4));
  EXPECT_EQ(EncodeAs(v1::DTYPE_BF16, {1.0f, -2.0f}), std::string("\x80\x3f\x00\xc0", 4));
  EXPECT_EQ(EncodeAs(v1::DTYPE_F16, {1.0f}), std::string("\x00\x3c", 2));
}

TEST(HostLayerTest, ShapesSizesAndTemplate) {
  LoadgenConfig config;
  config.kv_heads = 2;
  config.tokens = 16;
  config.head_dim = 4;
  config.q_heads = 4;
  config.window = 3;
  config.dtype = v1::DTYPE_F16;
  const HostLayer keys_only = MakeHostLayer(config, false, false);
  EXPECT_EQ(keys_only.keys.size(), 2u * 16 * 4 * 2);
  EXPECT_TRUE(keys_only.values.empty());
  EXPECT_TRUE(keys_only.queries.empty());
  EXPECT_EQ(keys_only.bytes(), keys_only.keys.size());

  const HostLayer all = MakeHostLayer(config, true, true);
  EXPECT_EQ(all.keys, keys_only.keys);  // same seed, same keys
  EXPECT_NE(all.values, all.keys);      // an independent stream
  EXPECT_EQ(all.queries.size(), 4u * 3 * 4 * 2);
  EXPECT_EQ(all.values_offset(), all.keys.size());
  EXPECT_EQ(all.queries_offset(), 2 * all.keys.size());
  EXPECT_EQ(all.bytes(), 2 * all.keys.size() + all.queries.size());

  const v1::LayerInput layer = LayerTemplate(all, 5);
  EXPECT_EQ(layer.layer_id(), 5);
  EXPECT_EQ(layer.keys().dtype(), v1::DTYPE_F16);
  EXPECT_EQ(std::vector<int64_t>(layer.keys().shape().begin(), layer.keys().shape().end()),
            (std::vector<int64_t>{2, 16, 4}));
  EXPECT_EQ(std::vector<int64_t>(layer.queries().shape().begin(), layer.queries().shape().end()),
            (std::vector<int64_t>{4, 3, 4}));
  EXPECT_EQ(layer.keys().data_case(), v1::Tensor::DATA_NOT_SET);
  EXPECT_FALSE(LayerTemplate(keys_only, 0).has_values());
  EXPECT_FALSE(LayerTemplate(keys_only, 0).has_queries());
}

}  // namespace
}  // namespace kvtrim::loadgen
