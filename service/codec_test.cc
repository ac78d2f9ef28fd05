// Unit tests of the proto codecs and the one status conversion.
#include <cmath>

#include "service/response_codec.h"
#include "service/settings_codec.h"
#include "service/status.h"
#include "kernels/cpu/cpu_backend.h"
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
  auto out = DecodeSettings(s, "settings", Numerics::kFast);
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

TEST(SettingsCodecTest, PerturbationModes) {
  v1::CompressionSettings s = MakeSettings("dropkv");
  auto full = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(full->perturbation);  // UNSPECIFIED = FULL
  s.set_perturbation(v1::PERTURBATION_OFF);
  auto off = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->perturbation);
  EXPECT_FALSE(off->perturbation_sampled);
  s.set_perturbation(v1::PERTURBATION_FULL);
  EXPECT_TRUE(DecodeSettings(s, "settings", Numerics::kFast)->perturbation);
  EXPECT_FALSE(DecodeSettings(s, "settings", Numerics::kFast)->perturbation_sampled);
  s.set_perturbation(v1::PERTURBATION_SAMPLED);
  auto sampled = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_TRUE(sampled.ok());
  EXPECT_TRUE(sampled->perturbation);
  EXPECT_TRUE(sampled->perturbation_sampled);
  s.set_perturbation(static_cast<v1::Perturbation>(9));
  auto bad = DecodeSettings(s, "begin", Numerics::kFast);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("begin.perturbation: unknown perturbation mode 9"));
}

TEST(SettingsCodecTest, UnsetOptionalsStayUnset) {
  auto out = DecodeSettings(MakeSettings("knorm"), "begin", Numerics::kFast);
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->sink_tokens.has_value());
  EXPECT_FALSE(out->recent_tokens.has_value());
  EXPECT_EQ(out->output_shape, OutputShape::kPerHead);
}

TEST(SettingsCodecTest, KeepTokensBudget) {
  v1::CompressionSettings s = MakeSettings("knorm");
  s.mutable_budget()->set_keep_tokens(12);
  auto out = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->budget.by_fraction);
  EXPECT_EQ(out->budget.keep_tokens, 12);
  s.mutable_budget()->set_keep_tokens(-3);
  auto bad = DecodeSettings(s, "begin", Numerics::kFast);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("begin.budget.keep_tokens: must be >= 1, got -3"));
}

TEST(SettingsCodecTest, MaxPerturbationBudget) {
  v1::CompressionSettings s = MakeSettings("dropkv");
  s.mutable_budget()->mutable_max_perturbation()->set_epsilon(0.05);
  auto out = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->budget.by_perturbation);
  EXPECT_EQ(out->budget.epsilon, 0.05);
  EXPECT_TRUE(out->budget.by_fraction);      // the cap is a fraction budget
  EXPECT_EQ(out->budget.keep_fraction, 1.0);  // max_keep_fraction unset (0) = 1
  s.mutable_budget()->mutable_max_perturbation()->set_max_keep_fraction(0.4);
  EXPECT_EQ(DecodeSettings(s, "settings", Numerics::kFast)->budget.keep_fraction, 0.4);
  s.mutable_budget()->mutable_max_perturbation()->set_max_keep_fraction(1);
  EXPECT_TRUE(DecodeSettings(s, "settings", Numerics::kFast).ok());
  // Every refusal is INVALID_ARGUMENT naming the field, numbers printed exactly.
  struct Bad {
    double epsilon, cap;
    std::string message;
  };
  const Bad bad[] = {
      {std::nan(""), 0.5,
       "begin.budget.max_perturbation.epsilon: must be finite and >= 0, got nan"},
      {-0.1, 0.5, "begin.budget.max_perturbation.epsilon: must be finite and >= 0, got -0.1"},
      {HUGE_VAL, 0.5, "begin.budget.max_perturbation.epsilon: must be finite and >= 0, got inf"},
      {0.1, 1.5, "begin.budget.max_perturbation.max_keep_fraction: must be in (0, 1] (0 = 1), "
                 "got 1.5"},
      {0.1, 1.0000000000000002, "begin.budget.max_perturbation.max_keep_fraction: must be in "
                                "(0, 1] (0 = 1), got 1.0000000000000002"},
      {0.1, -0.5, "begin.budget.max_perturbation.max_keep_fraction: must be in (0, 1] (0 = 1), "
                  "got -0.5"},
      {0.1, std::nan(""), "begin.budget.max_perturbation.max_keep_fraction: must be in (0, 1] "
                          "(0 = 1), got nan"},
  };
  for (const Bad& b : bad) {
    s.mutable_budget()->mutable_max_perturbation()->set_epsilon(b.epsilon);
    s.mutable_budget()->mutable_max_perturbation()->set_max_keep_fraction(b.cap);
    auto refused = DecodeSettings(s, "begin", Numerics::kFast);
    ASSERT_FALSE(refused.ok()) << b.message;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(refused.status().message()), b.message);
  }
}

TEST(SettingsCodecTest, EmptyBudgetOneofIsRequired) {
  v1::CompressionSettings s = MakeSettings("knorm");
  s.mutable_budget()->Clear();  // budget present, no value
  auto out = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), ::testing::HasSubstr("settings.budget: required"));
}

TEST(SettingsCodecTest, NumericsUnspecifiedTakesTheServerDefault) {
  const v1::CompressionSettings s = MakeSettings("knorm");
  ASSERT_EQ(s.numerics(), v1::NUMERICS_UNSPECIFIED);
  auto fast = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->numerics, Numerics::kFast);
  auto exact = DecodeSettings(s, "settings", Numerics::kExact);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->numerics, Numerics::kExact);
}

TEST(SettingsCodecTest, NumericsAskedForWinsOverTheServerDefault) {
  v1::CompressionSettings s = MakeSettings("knorm");
  s.set_numerics(v1::NUMERICS_FAST);
  auto fast = DecodeSettings(s, "settings", Numerics::kExact);
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->numerics, Numerics::kFast);
  s.set_numerics(v1::NUMERICS_EXACT);
  auto exact = DecodeSettings(s, "begin", Numerics::kFast);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->numerics, Numerics::kExact);
}

TEST(SettingsCodecTest, UnknownNumericsValueNamesTheField) {
  v1::CompressionSettings s = MakeSettings("knorm");
  s.set_numerics(static_cast<v1::Numerics>(7));  // proto3 keeps unknown enum values
  auto out = DecodeSettings(s, "settings", Numerics::kFast);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()),
              ::testing::HasSubstr("settings.numerics: unknown numerics mode 7"));
  auto begin = DecodeSettings(s, "begin", Numerics::kExact);
  EXPECT_THAT(std::string(begin.status().message()), ::testing::HasSubstr("begin.numerics"));
}

TEST(ResponseCodecTest, EncodesNumericsOfTheDecision) {
  LayerDecision d;
  d.offsets = {0};
  v1::LayerResult r;
  EncodeLayerResult(d, &r);  // a default decision says exact
  EXPECT_EQ(r.numerics(), v1::NUMERICS_EXACT);
  d.numerics = Numerics::kFast;
  v1::LayerResult fast;
  EncodeLayerResult(d, &fast);
  EXPECT_EQ(fast.numerics(), v1::NUMERICS_FAST);
  EXPECT_EQ(EncodeNumerics(Numerics::kExact), v1::NUMERICS_EXACT);
}

/// A backend that reports fast for the knorm scorer only (the numerics list of ListPolicies
/// comes from the serving backend).
class FastKnormBackend final : public Backend {
 public:
  const char* name() const override { return "test"; }
  absl::Status CompressLayer(const ResolvedPolicy&, const ValidatedLayer&, const LayerBudget&,
                             LayerDecision*) override {
    return absl::UnimplementedError("test backend");
  }
  std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                      const AllocatorSpec&) const override {
    if (scorer.name == "knorm") return {Numerics::kExact, Numerics::kFast};
    return {Numerics::kExact};
  }
};

const v1::PolicyInfo* FindPolicy(const v1::ListPoliciesResponse& list, const std::string& name) {
  for (const v1::PolicyInfo& info : list.policies()) {
    if (info.name() == name) return &info;
  }
  return nullptr;
}

TEST(ResponseCodecTest, PoliciesListTheBackendsNumericsModesFastFirst) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  FastKnormBackend backend;
  v1::ListPoliciesResponse list;
  EncodePolicies(registry, backend, &list);
  const v1::PolicyInfo* knorm = FindPolicy(list, "knorm");
  ASSERT_NE(knorm, nullptr);
  EXPECT_THAT(knorm->numerics_modes(), ::testing::ElementsAre(v1::NUMERICS_FAST,
                                                              v1::NUMERICS_EXACT));
  const v1::PolicyInfo* adakv = FindPolicy(list, "knorm+adakv");
  ASSERT_NE(adakv, nullptr);
  EXPECT_THAT(adakv->numerics_modes(), ::testing::ElementsAre(v1::NUMERICS_FAST,
                                                              v1::NUMERICS_EXACT));
  const v1::PolicyInfo* snapkv = FindPolicy(list, "snapkv");
  ASSERT_NE(snapkv, nullptr);
  EXPECT_THAT(snapkv->numerics_modes(), ::testing::ElementsAre(v1::NUMERICS_EXACT));
  CpuBackend cpu(1);
  v1::ListPoliciesResponse on_cpu;
  EncodePolicies(registry, cpu, &on_cpu);
  for (const v1::PolicyInfo& info : on_cpu.policies()) {
    EXPECT_EQ(std::vector<int>(info.numerics_modes().begin(), info.numerics_modes().end()),
              CpuNumericsModes(info.scorer()))
        << info.name();
  }
}

TEST(ResponseCodecTest, PoliciesListOnlyComposablePairsWithTheirOutputShapes) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend cpu(1);
  v1::ListPoliciesResponse list;
  EncodePolicies(registry, cpu, &list);
  for (const char* refused : {"laprox+adakv", "laprox+pyramid", "laprox+lukv"}) {
    EXPECT_EQ(FindPolicy(list, refused), nullptr) << refused;
  }
  const v1::PolicyInfo* laprox = FindPolicy(list, "laprox+uniform");
  ASSERT_NE(laprox, nullptr);
  EXPECT_THAT(laprox->output_shapes(), ::testing::ElementsAre(v1::PER_HEAD, v1::EQUAL_COUNT));
  const v1::PolicyInfo* snapkv = FindPolicy(list, "snapkv+lukv");
  ASSERT_NE(snapkv, nullptr);
  EXPECT_THAT(snapkv->output_shapes(),
              ::testing::ElementsAre(v1::PER_HEAD, v1::SHARED, v1::BLOCK_ALIGNED,
                                     v1::EQUAL_COUNT));
  // Every scorer with every allocator it composes with, after the presets.
  size_t composable = 0;
  for (const ScorerSpec* scorer : registry.scorers()) {
    for (const AllocatorSpec* allocator : registry.allocators()) {
      composable += PolicyRegistry::CheckComposable(*scorer, *allocator).ok();
    }
  }
  EXPECT_EQ(static_cast<size_t>(list.policies_size()), registry.presets().size() + composable);
  EXPECT_EQ(composable, registry.scorers().size() * registry.allocators().size() - 3);
  EXPECT_EQ(list.scorers_size(), static_cast<int>(registry.scorers().size()));
  EXPECT_EQ(list.allocators_size(), static_cast<int>(registry.allocators().size()));
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
