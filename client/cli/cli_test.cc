// Tests of the CLI's argument parsing, --param parsing, request settings and printing.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command_help.h"
#include "client/cli/commands.h"
#include "client/cli/json_print.h"
#include "client/cli/output.h"
#include "client/cli/flag_parse.h"
#include "client/cli/param_parse.h"
#include "client/cli/print.h"
#include "version/build_version.h"

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

/// A layer answer of `kept` per KV head over `n` tokens, with `perturbation` per head when
/// given (one value per head) and `compute_seconds`.
v1::LayerResult SummaryLayer(int64_t n, const std::vector<int32_t>& kept,
                             const std::vector<double>& perturbation, double compute_seconds) {
  v1::LayerResult layer;
  layer.set_num_tokens(n);
  layer.set_compute_seconds(compute_seconds);
  for (size_t h = 0; h < kept.size(); ++h) {
    v1::HeadStats* head = layer.add_heads();
    head->set_kept(kept[h]);
    if (h < perturbation.size()) head->set_perturbation(perturbation[h]);
  }
  return layer;
}

TEST(SummaryTest, BudgetLabelNamesEachKindOfBudget) {
  v1::Budget budget;
  budget.set_keep_fraction(0.2);
  EXPECT_EQ(BudgetLabel(budget), "0.2");
  budget.set_keep_tokens(64);
  EXPECT_EQ(BudgetLabel(budget), "64 tokens");
  budget.mutable_max_perturbation()->set_epsilon(0.2);
  EXPECT_EQ(BudgetLabel(budget), "eps=0.2");
  budget.mutable_max_perturbation()->set_max_keep_fraction(0.5);
  EXPECT_EQ(BudgetLabel(budget), "eps=0.2,max=0.5");
  EXPECT_EQ(BudgetLabel(v1::Budget()), "-");
}

TEST(SummaryTest, TotalsKeptAndCachedOverLayersAndMeansThePerturbationOverHeads) {
  CompressOptions options;
  options.policy = "dropkv";
  options.max_perturbation = 0.2;
  absl::StatusOr<v1::CompressionSettings> settings = BuildSettings(options);
  ASSERT_TRUE(settings.ok()) << settings.status();
  const CompressSummary summary =
      Summarize(*settings, {SummaryLayer(100, {10, 30}, {0.1, 0.2}, 0.001),
                            SummaryLayer(50, {5, 15}, {0.3, 0.4}, 0.0025)});
  EXPECT_EQ(summary.policy, "dropkv");
  EXPECT_EQ(summary.budget, "eps=0.2");
  EXPECT_EQ(summary.kept, 60);
  EXPECT_EQ(summary.cached, 300);
  ASSERT_TRUE(summary.mean_perturbation.has_value());
  EXPECT_DOUBLE_EQ(*summary.mean_perturbation, 0.25);
  EXPECT_DOUBLE_EQ(summary.compute_seconds, 0.0035);

  // Heads without the statistic (no values or queries, --noperturbation) are left out of
  // the mean; with none at all the mean is unset.
  EXPECT_DOUBLE_EQ(*Summarize(*settings, {SummaryLayer(10, {1, 2}, {0.5}, 0)}).mean_perturbation,
                   0.5);
  EXPECT_FALSE(
      Summarize(*settings, {SummaryLayer(10, {1, 2}, {}, 0)}).mean_perturbation.has_value());
}

TEST(SummaryTest, HeaderAndRowsLineUp) {
  CompressSummary summary;
  summary.policy = "streaming_llm";
  summary.budget = "0.2";
  summary.kept = 1020;
  summary.cached = 5120;
  summary.mean_perturbation = 0.98765;
  summary.compute_seconds = 0.0021234;
  std::ostringstream header, row, empty_row;
  PrintSummaryHeader(header);
  PrintSummaryRow(summary, row);
  summary.mean_perturbation.reset();
  summary.cached = 0;
  summary.kept = 0;
  PrintSummaryRow(summary, empty_row);
  EXPECT_EQ(header.str(), "policy           keep            kept tokens         perturbation"
                          "   server compute ms\n");
  EXPECT_EQ(row.str(), "streaming_llm    0.2             1020/5120 (19.9%)         0.9877"
                       "               2.123\n");
  EXPECT_EQ(empty_row.str(), "streaming_llm    0.2             0/0 (0.0%)                     -"
                             "               2.123\n");
  // Every column ends where its header ends, an error target with a cap included.
  EXPECT_EQ(row.str().size(), header.str().size());
  summary.budget = "eps=0.1,max=0.5";
  std::ostringstream capped_row;
  PrintSummaryRow(summary, capped_row);
  EXPECT_EQ(capped_row.str().size(), header.str().size()) << capped_row.str();
}

TEST(SummaryTest, SummaryHeaderWithoutSummaryIsAUsageError) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect("127.0.0.1:1");
  ASSERT_TRUE(client.ok()) << client.status();
  CompressOptions options;
  options.policy = "dropkv";
  options.keep_fraction = 0.2;
  options.input = "unused.safetensors";
  options.summary_header = true;
  std::ostringstream out, err;
  Output output(out, err, /*json=*/false);
  EXPECT_EQ(RunCompress(**client, options, output), kExitUsage);
  EXPECT_EQ(err.str(), "usage error: --summary_header is the header of --summary; give both\n");
  EXPECT_EQ(out.str(), "");
}

TEST(OutputTest, ErrorsAreOneJsonObjectOnStderrWithJson) {
  std::ostringstream out, err;
  Output output(out, err, /*json=*/true);
  EXPECT_EQ(output.RpcError("Compress", absl::InvalidArgumentError("layers[0].keys: bad")),
            kExitRpcError);
  EXPECT_EQ(output.UsageError("--input is required"), kExitUsage);
  EXPECT_EQ(output.InputError(std::string("bad \xff byte")), kExitUsage);
  std::istringstream lines(err.str());
  std::string line;
  std::vector<nlohmann::json> errors;
  while (std::getline(lines, line)) errors.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[0]["error"],
            (nlohmann::json{{"kind", "rpc"}, {"rpc", "Compress"}, {"code", "INVALID_ARGUMENT"},
                            {"message", "layers[0].keys: bad"}}));
  EXPECT_EQ(errors[1]["error"]["kind"], "usage");
  EXPECT_EQ(errors[1]["error"]["message"], "--input is required");
  EXPECT_EQ(errors[2]["error"]["kind"], "input");  // not UTF-8: replaced, still JSON
  EXPECT_EQ(out.str(), "");
  std::ostringstream text_out, text_err;
  Output text(text_out, text_err, /*json=*/false);
  text.RpcError("Compress", absl::NotFoundError("no model"));
  EXPECT_EQ(text_err.str(), "error: Compress: NOT_FOUND: no model\n");
}

TEST(OutputTest, ProtoJsonKeepsFieldNamesAndPrintsZeros) {
  v1::ListModelsResponse models;
  v1::ModelInfo* model = models.add_models();
  model->set_digest("sha256:ab");
  model->mutable_header()->set_num_layers(0);
  const nlohmann::json json = ProtoJson(models);
  EXPECT_EQ(json["models"][0]["digest"], "sha256:ab");
  EXPECT_EQ(json["models"][0]["header"]["num_layers"], 0);  // printed although zero
  EXPECT_TRUE(json["models"][0]["weights"].is_array());
}

TEST(JsonPrintTest, LayerJsonUnpacksTheKeptListsAndMarksMissingPerturbation) {
  v1::LayerResult layer;
  layer.set_layer_id(3);
  layer.set_num_tokens(5);
  layer.set_output_shape(v1::PER_HEAD);
  for (int head = 0; head < 2; ++head) layer.add_heads()->set_kept(2);
  for (int64_t offset : {0, 2, 4}) layer.add_offsets(offset);
  for (int32_t index : {0, 4, 1, 3}) layer.add_indices(index);
  const nlohmann::json json = LayerJson(layer, 0.5, /*show_indices=*/true);
  EXPECT_EQ(json["layer_id"], 3);
  EXPECT_EQ(json["kept"], (nlohmann::json{2, 2}));
  EXPECT_TRUE(json["perturbation"].is_null());
  EXPECT_EQ(json["kept_indices"], (nlohmann::json{{0, 4}, {1, 3}}));
  EXPECT_EQ(json["round_trip_seconds"], 0.5);
  EXPECT_FALSE(LayerJson(layer, 0.5, /*show_indices=*/false).contains("kept_indices"));
  layer.mutable_heads(0)->set_perturbation(0.25);
  EXPECT_EQ(LayerJson(layer, 0, false)["perturbation"], (nlohmann::json{0.25, nullptr}));
}

TEST(CommandHelpTest, EveryCommandNamesOnlyRegisteredFlags) {
  for (const CommandInfo& command : Commands()) {
    EXPECT_EQ(FindCommand(command.name), &command);
    for (const std::string& flag : command.flags) {
      EXPECT_NE(absl::FindCommandLineFlag(flag), nullptr) << command.name << " --" << flag;
    }
  }
  EXPECT_EQ(FindCommand("compres"), nullptr);
}

TEST(VersionTest, TheCommitIsHexOrUnknown) {
  const std::string commit = GitCommit();
  EXPECT_TRUE(std::regex_match(commit, std::regex("[0-9a-f]{7,40}(-dirty)?|unknown"))) << commit;
  EXPECT_EQ(VersionLine(), absl::StrCat(ReleaseVersion(), " (git ", commit, ")"));
  EXPECT_TRUE(std::regex_match(std::string(ReleaseVersion()), std::regex("[0-9]+\\.[0-9]+\\.[0-9]+")));
}

}  // namespace
}  // namespace kvtrim::cli
