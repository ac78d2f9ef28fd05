// Unit tests of the proto codecs and the one status conversion.
#include "service/response_codec.h"
#include "service/settings_codec.h"
#include "service/status.h"
#include "service/tensor_codec.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

TEST(StatusTest, ConvertsCodeAndMessage) {
  const grpc::Status s = ToGrpcStatus(absl::InvalidArgumentError("layers[0].keys: bad"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "layers[0].keys: bad");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("x")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kFailedPrecondition), "FAILED_PRECONDITION");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kOk), "OK");
}

TEST(TensorCodecTest, DecodesWithoutCopyWhenAligned) {
  const v1::Tensor t = MakeTensor(v1::DTYPE_F16, {2, 3, 4}, Values(24, 1));
  OwnedBuffers owned;
  auto view = DecodeTensor(t, TensorRole::kKeys, EngineLimits{}, "k", &owned);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->dtype, DType::kF16);
  EXPECT_EQ(view->shape, (std::array<int64_t, 3>{2, 3, 4}));
  EXPECT_EQ(view->data, t.inline_data().data());
  EXPECT_TRUE(owned.empty());
}

TEST(TensorCodecTest, RejectsDimensionsAboveLimits) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  t.add_shape(2);
  t.add_shape(int64_t{1} << 40);
  t.add_shape(8);
  t.set_inline_data("x");
  OwnedBuffers owned;
  auto view = DecodeTensor(t, TensorRole::kKeys, EngineLimits{}, "layers[0].keys", &owned);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(view.status().message()),
              ::testing::HasSubstr("layers[0].keys.shape[1]: n="));
}

TEST(TensorCodecTest, NegativeDimensionNamesIt) {
  v1::Tensor t = MakeTensor(v1::DTYPE_F32, {4, 1, 8}, Values(32, 1));
  t.set_shape(0, -4);
  OwnedBuffers owned;
  auto view = DecodeTensor(t, TensorRole::kQueries, EngineLimits{}, "layer.queries", &owned);
  ASSERT_FALSE(view.ok());
  EXPECT_THAT(std::string(view.status().message()),
              ::testing::HasSubstr("layer.queries.shape[0]: H_q must be >= 1, got -4"));
}

TEST(SettingsCodecTest, DecodesEveryField) {
  v1::CompressionSettings s = MakeSettings("snapkv", 0.25);
  (*s.mutable_policy()->mutable_params())["window"].set_number(16);
  (*s.mutable_policy()->mutable_params())["pooling"].set_text("avg");
  (*s.mutable_policy()->mutable_params())["flag"].set_flag(true);
  s.set_sink_tokens(4);
  s.set_recent_tokens(0);
  s.set_output_shape(v1::SHARED);
  s.set_num_layers(32);
  s.set_seed(7);
  auto out = DecodeSettings(s, "settings");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->policy, "snapkv");
  EXPECT_TRUE(out->budget.by_fraction);
  EXPECT_EQ(out->budget.keep_fraction, 0.25);
  EXPECT_EQ(out->params.at("window").number, 16);
  EXPECT_EQ(out->params.at("pooling").text, "avg");
  EXPECT_EQ(out->params.at("flag").number, 1);
  EXPECT_EQ(out->sink_tokens, 4);
  EXPECT_EQ(out->recent_tokens, 0);
  EXPECT_EQ(out->output_shape, OutputShape::kShared);
  EXPECT_EQ(out->num_layers, 32);
  EXPECT_EQ(out->seed, 7u);
}

TEST(SettingsCodecTest, UnsetOptionalsStayUnset) {
  auto out = DecodeSettings(MakeSettings("knorm"), "begin");
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->sink_tokens.has_value());
  EXPECT_FALSE(out->recent_tokens.has_value());
  EXPECT_EQ(out->output_shape, OutputShape::kPerHead);
}

TEST(SettingsCodecTest, KeepTokensBudget) {
  v1::CompressionSettings s = MakeSettings("knorm");
  s.mutable_budget()->set_keep_tokens(12);
  auto out = DecodeSettings(s, "settings");
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->budget.by_fraction);
  EXPECT_EQ(out->budget.keep_tokens, 12);
  s.mutable_budget()->set_keep_tokens(-3);
  auto bad = DecodeSettings(s, "begin");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("begin.budget.keep_tokens: must be >= 1, got -3"));
}

TEST(SettingsCodecTest, EmptyBudgetOneofIsRequired) {
  v1::CompressionSettings s = MakeSettings("knorm");
  s.mutable_budget()->Clear();  // budget present, no value
  auto out = DecodeSettings(s, "settings");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), ::testing::HasSubstr("settings.budget: required"));
}

TEST(ResponseCodecTest, EncodesCsrAndStats) {
  LayerDecision d;
  d.layer_id = 3;
  d.num_tokens = 10;
  d.offsets = {0, 2, 5};
  d.indices = {1, 7, 0, 4, 9};
  d.kept_per_head = {2, 3};
  d.perturbation = {0.1, 0.2};
  d.compute_seconds = 0.5;
  v1::LayerResult r;
  EncodeLayerResult(d, &r);
  EXPECT_EQ(r.layer_id(), 3);
  EXPECT_EQ(r.num_tokens(), 10);
  EXPECT_EQ(r.output_shape(), v1::PER_HEAD);
  EXPECT_THAT(r.offsets(), ::testing::ElementsAre(0, 2, 5));
  EXPECT_THAT(r.indices(), ::testing::ElementsAre(1, 7, 0, 4, 9));
  ASSERT_EQ(r.heads_size(), 2);
  EXPECT_EQ(r.heads(1).kept(), 3);
  EXPECT_DOUBLE_EQ(r.heads(1).perturbation(), 0.2);
  d.perturbation.clear();
  v1::LayerResult no_perturbation;
  EncodeLayerResult(d, &no_perturbation);
  EXPECT_FALSE(no_perturbation.heads(0).has_perturbation());
}

}  // namespace
}  // namespace kvtrim::service::testing
