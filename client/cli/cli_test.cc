// Tests of the CLI's argument parsing, --param parsing and request settings.
#include <gtest/gtest.h>

#include <optional>
#include <sstream>

#include "absl/flags/flag.h"
#include "client/cli/commands.h"
#include "client/cli/flag_parse.h"
#include "client/cli/param_parse.h"
#include "client/cli/print.h"

ABSL_FLAG(std::string, test_name, "x", "a string flag for the parser tests");
ABSL_FLAG(bool, test_switch, false, "a bool flag for the parser tests");
ABSL_FLAG(std::optional<double>, test_fraction, std::nullopt, "an optional flag");

namespace kvtrim::cli {
namespace {

TEST(ParseArgsTest, SetsFlagsInEveryFormAndKeepsPositionals) {
  absl::StatusOr<ParsedArgs> args = ParseArgs(
      {"--test_name=a", "compress", "-test_fraction", "0.25", "--test_switch", "--", "--x"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "a");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_fraction), 0.25);
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_EQ(args->positional, (std::vector<std::string>{"compress", "--x"}));
  EXPECT_FALSE(args->help);
  ASSERT_TRUE(ParseArgs({"--notest_switch", "-h"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_TRUE(ParseArgs({"--help"})->help);
}

TEST(ParseArgsTest, UsageErrorsNameTheFlag) {
  absl::StatusOr<ParsedArgs> args = ParseArgs({"--no_such_flag=1"});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(args.status().message(), "unknown flag --no_such_flag");
  args = ParseArgs({"--test_fraction=abc"});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(args.status().message().find("flag --test_fraction=abc"), std::string::npos);
  EXPECT_EQ(ParseArgs({"--test_name"}).status().message(), "flag --test_name needs a value");
}

TEST(ParseParamsTest, NumbersFlagsAndText) {
  auto params = ParseParams("window=8,pooling=max,normalize=true,alpha=0.2");
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->at("window").number(), 8);
  EXPECT_EQ(params->at("pooling").text(), "max");
  EXPECT_TRUE(params->at("normalize").flag());
  EXPECT_DOUBLE_EQ(params->at("alpha").number(), 0.2);
  EXPECT_TRUE(ParseParams("")->empty());
}

TEST(ParseParamsTest, Errors) {
  EXPECT_EQ(ParseParams("window").status().message(), "--param: \"window\" is not name=value");
  EXPECT_EQ(ParseParams("a=1,a=2").status().message(), "--param: \"a\" given twice");
  EXPECT_EQ(ParseOutputShape("ragged").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseOutputShape("shared"), v1::SHARED);
}

TEST(BuildSettingsTest, FillsEveryField) {
  CompressOptions options;
  options.policy = "snapkv";
  options.keep_fraction = 0.25;
  options.params = "window=16";
  options.sink_tokens = 4;
  options.output_shape = "shared";
  options.seed = 7;
  absl::StatusOr<v1::CompressionSettings> settings = BuildSettings(options);
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->policy().name(), "snapkv");
  EXPECT_EQ(settings->policy().params().at("window").number(), 16);
  EXPECT_DOUBLE_EQ(settings->budget().keep_fraction(), 0.25);
  EXPECT_TRUE(settings->has_sink_tokens());
  EXPECT_EQ(settings->sink_tokens(), 4);
  EXPECT_FALSE(settings->has_recent_tokens());
  EXPECT_EQ(settings->output_shape(), v1::SHARED);
  EXPECT_EQ(settings->seed(), 7u);
}

TEST(BuildSettingsTest, BudgetMustBeExactlyOne) {
  CompressOptions options;
  options.policy = "snapkv";
  EXPECT_EQ(BuildSettings(options).status().message(),
            "give exactly one of --keep_fraction, --keep_tokens and --max_perturbation");
  options.keep_fraction = 0.5;
  options.keep_tokens = 3;
  EXPECT_EQ(BuildSettings(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.keep_fraction.reset();
  EXPECT_EQ(BuildSettings(options)->budget().keep_tokens(), 3);
  options.policy.clear();
  EXPECT_EQ(BuildSettings(options).status().message(), "--policy is required");
}

TEST(BuildSettingsTest, MaxPerturbationBudgetWithAndWithoutCap) {
  CompressOptions options;
  options.policy = "snapkv";
  options.max_perturbation = 0.05;
  auto settings = BuildSettings(options);
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->budget().value_case(), v1::Budget::kMaxPerturbation);
  EXPECT_DOUBLE_EQ(settings->budget().max_perturbation().epsilon(), 0.05);
  EXPECT_DOUBLE_EQ(settings->budget().max_perturbation().max_keep_fraction(), 0.0);
  options.max_keep = 0.5;
  EXPECT_DOUBLE_EQ(BuildSettings(options)->budget().max_perturbation().max_keep_fraction(), 0.5);
  options.keep_fraction = 0.5;
  EXPECT_EQ(BuildSettings(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.keep_fraction.reset();
  options.max_perturbation.reset();
  options.keep_tokens = 3;
  EXPECT_EQ(BuildSettings(options).status().message(),
            "--max_keep is the cap of --max_perturbation; give both");
}

TEST(BuildSettingsTest, NumericsDefaultsToTheServersChoice) {
  CompressOptions options;
  options.policy = "snapkv";
  options.keep_fraction = 0.5;
  EXPECT_EQ(BuildSettings(options)->numerics(), v1::NUMERICS_UNSPECIFIED);
  options.numerics = "fast";
  EXPECT_EQ(BuildSettings(options)->numerics(), v1::NUMERICS_FAST);
  EXPECT_EQ(BuildSettings(options)->perturbation(), v1::PERTURBATION_FULL);
  options.perturbation = false;
  EXPECT_EQ(BuildSettings(options)->perturbation(), v1::PERTURBATION_OFF);
  options.perturbation = true;
  options.numerics = "exact";
  EXPECT_EQ(BuildSettings(options)->numerics(), v1::NUMERICS_EXACT);
  options.numerics = "turbo";
  const absl::Status bad = BuildSettings(options).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "--numerics: \"turbo\" is not fast or exact (leave it empty for the server default)");
}

TEST(PrintTest, LayerLinePrintsTheNumericsThatComputedIt) {
  v1::LayerResult layer;
  layer.set_layer_id(2);
  layer.set_num_tokens(10);
  layer.set_output_shape(v1::PER_HEAD);
  layer.set_numerics(v1::NUMERICS_EXACT);
  layer.add_offsets(0);
  layer.add_offsets(1);
  layer.add_indices(4);
  layer.add_heads()->set_kept(1);
  std::ostringstream out;
  PrintLayer(layer, 0.5, false, out);
  EXPECT_NE(out.str().find("layer 2  n=10  output=PER_HEAD  numerics=exact  compute="),
            std::string::npos)
      << out.str();
}

TEST(PrintTest, PoliciesPrintTheirShapesAndNumericsModes) {
  v1::ListPoliciesResponse list;
  v1::PolicyInfo* policy = list.add_policies();
  policy->set_name("laprox");
  policy->add_output_shapes(v1::PER_HEAD);
  policy->add_output_shapes(v1::EQUAL_COUNT);
  policy->add_numerics_modes(v1::NUMERICS_FAST);
  policy->add_numerics_modes(v1::NUMERICS_EXACT);
  std::ostringstream out;
  PrintPolicies(list, out);
  EXPECT_NE(out.str().find("  shapes:    per_head, equal_count  numerics: fast, exact\n"),
            std::string::npos)
      << out.str();
}

}  // namespace
}  // namespace kvtrim::cli
