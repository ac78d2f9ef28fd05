// Tests of the typed enum parameters (scorer_params.h): a resolved value reads as its choice's
// index, every typed parameter of the registry is declared with its enum's choice list, and
// ReadWindowPooling reads the window-attention parameters.
#include "kernels/scorer_params.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/params.h"
#include "kernels/registry.h"
#include "tests/testing/status_matchers.h"

namespace kvtrim {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

TEST(ScorerParams, AnEnumValueReadsAsItsChoiceIndexDefaultOrSent) {
  const std::vector<ParamSpec> specs = {
      ParamSpec::Enum("gqa", "head_bound", LaProxGqaChoices(), "gqa")};
  absl::StatusOr<ResolvedParams> by_default = ResolvedParams::Resolve(specs, {}, "params");
  ASSERT_TRUE(by_default.ok());
  EXPECT_EQ(by_default->Enum<LaProxGqa>("gqa"), LaProxGqa::kHeadBound);
  for (size_t i = 0; i < LaProxGqaChoices().size(); ++i) {
    absl::StatusOr<ResolvedParams> sent = ResolvedParams::Resolve(
        specs, {{"gqa", ParamValue::Text(LaProxGqaChoices()[i])}}, "params");
    ASSERT_TRUE(sent.ok());
    EXPECT_EQ(sent->Choice("gqa"), static_cast<int>(i));
    EXPECT_EQ(sent->Text("gqa"), LaProxGqaChoices()[i]);
  }
  EXPECT_THAT(ResolvedParams::Resolve(specs, {{"gqa", ParamValue::Text("median")}}, "params")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("params.gqa")));
}

TEST(ScorerParams, TheRegistryDeclaresEveryTypedParameterWithItsEnumsChoices) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  // (scorer, parameter) -> the choice list of the enum its code reads it as.
  const std::map<std::pair<std::string, std::string>, const std::vector<std::string>*> typed = {
      {{"snapkv", "pooling"}, &PoolKindChoices()},
      {{"dropkv", "pooling"}, &PoolKindChoices()},
      {{"criticalkv", "pooling"}, &PoolKindChoices()},
      {{"laprox", "pooling"}, &PoolKindChoices()},
      {{"keydiff", "anchor"}, &KeyDiffAnchorChoices()},
      {{"dropkv", "bf16_prob_round"}, &Bf16ProbRoundChoices()},
      {{"criticalkv", "norm"}, &CriticalKVNormChoices()},
      {{"laprox", "mode"}, &LaProxModeChoices()},
      {{"laprox", "gqa"}, &LaProxGqaChoices()},
      {{"expected_attention", "query_stats"}, &QueryStatsSourceChoices()},
  };
  size_t enum_params = 0;
  for (const ScorerSpec* scorer : registry.scorers()) {
    for (const ParamSpec& param : scorer->params) {
      if (param.kind != ParamSpec::Kind::kEnum) continue;
      ++enum_params;
      const auto it = typed.find({scorer->name, param.name});
      ASSERT_NE(it, typed.end()) << scorer->name << "." << param.name
                                 << ": an enum parameter without its typed enum here";
      EXPECT_EQ(param.choices, *it->second) << scorer->name << "." << param.name;
    }
  }
  EXPECT_EQ(enum_params, typed.size());
}

TEST(ScorerParams, Bf16RoundingIsOnForBf16InputsUnderAuto) {
  EXPECT_TRUE(RoundsProbToBf16(Bf16ProbRound::kOn, DType::kF32));
  EXPECT_FALSE(RoundsProbToBf16(Bf16ProbRound::kOff, DType::kBF16));
  EXPECT_TRUE(RoundsProbToBf16(Bf16ProbRound::kAuto, DType::kBF16));
  EXPECT_FALSE(RoundsProbToBf16(Bf16ProbRound::kAuto, DType::kF16));
}

TEST(ScorerParams, ReadWindowPoolingReadsEveryWindowAttentionScorersParameters) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  int windowed = 0;
  for (const ScorerSpec* scorer : registry.scorers()) {
    const bool has_kernel = std::any_of(scorer->params.begin(), scorer->params.end(),
                                        [](const ParamSpec& p) { return p.name == "kernel"; });
    if (!has_kernel) continue;
    ++windowed;
    absl::StatusOr<ResolvedParams> p = ResolvedParams::Resolve(
        scorer->params,
        {{"window", ParamValue::Number(5)}, {"kernel", ParamValue::Number(3)},
         {"pooling", ParamValue::Text("avg")}},
        "params");
    ASSERT_TRUE(p.ok()) << scorer->name << ": " << p.status();
    const WindowPooling wp = ReadWindowPooling(*p);
    EXPECT_EQ(wp.window, 5) << scorer->name;
    EXPECT_EQ(wp.kernel, 3) << scorer->name;
    EXPECT_EQ(wp.pooling, PoolKind::kAvg) << scorer->name;
  }
  EXPECT_EQ(windowed, 4);  // snapkv, dropkv, criticalkv, laprox
}

}  // namespace
}  // namespace kvtrim
