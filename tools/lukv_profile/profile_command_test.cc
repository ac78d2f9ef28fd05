// kvtrim-lukv-profile end to end on the bundled samples (samples/calib/stories260k_q{0..3},
// samples/stories260k_model.safetensors): the profile's shape and invariants (lukv.md §9
// items 7-9 on calibration data), and that it reproduces samples/stories260k_lukv_snapkv.npy
// and the profile inside the bundle bit for bit.
#include "tools/lukv_profile/profile_command.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "client/cli/commands.h"
#include "tools/lukv_profile/profile_io.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/lukv/dp_oracle.h"
#include "kernels/lukv/greedy_solver.h"
#include "kernels/lukv/loss_curves.h"
#include "kernels/lukv/pava.h"
#include "tests/testing/test_dir.h"

namespace kvtrim::lukv_profile {
namespace {

using cli::kExitOk;
using cli::kExitUsage;

std::string SamplesDir() {
  const std::string prefill = KVTRIM_SAMPLE_PATH;
  return prefill.substr(0, prefill.find_last_of('/'));
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The options that built samples/stories260k_lukv_snapkv.npy (tools/README.md).
ProfileCommandOptions SampleOptions() {
  ProfileCommandOptions o;
  const std::string dir = SamplesDir();
  o.model = dir + "/stories260k_model.safetensors";
  o.metric = "snapkv";
  for (int q = 0; q < 4; ++q) {
    o.dumps.push_back(dir + "/calib/stories260k_q" + std::to_string(q) + ".safetensors");
  }
  o.sink = 0;
  o.window = 32;
  return o;
}

TEST(CliProfileTest, ReproducesTheSampleProfile) {
  std::unique_ptr<lukv::ProfileBuilder> builder;
  auto profile = BuildProfile(SampleOptions(), &builder, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->shape, (std::vector<int64_t>{99, 5, 4}));
  EXPECT_EQ(builder->num_dumps(), 4);
  const int64_t heads = 20, T = 200;
  for (int row = 0; row < lukv::kGridRows; ++row) {
    double mean = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const float r = profile->data[row * heads + h];
      EXPECT_GE(r, 0.0f);
      EXPECT_LE(r, 0.99f);
      if (row > 0) {
        EXPECT_GE(r, profile->data[(row - 1) * heads + h]) << "row " << row << " head " << h;
      }
      mean += r / static_cast<double>(heads);
    }
    EXPECT_NEAR(mean, lukv::GridRatio(row), 1.0 / T) << "row " << row;
  }
  // Bit-identical to the committed sample profile (regenerated deterministically).
  auto sample = ReadNpy(SamplesDir() + "/stories260k_lukv_snapkv.npy");
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->shape, profile->shape);
  EXPECT_EQ(sample->data, profile->data);
  const std::string sha = Sha256Hex(NpyDataBytes(*profile));
  EXPECT_NE(ReadText(SamplesDir() + "/stories260k_lukv_snapkv.npy.json")
                .find("\"sha256\": \"" + sha + "\""),
            std::string::npos);
  // The bundle carries the same profile with its manifest.
  auto bundle = ReadSafetensors(SamplesDir() + "/stories260k_model.safetensors");
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  ASSERT_EQ(bundle->tensors.count("profile.snapkv"), 1u);
  EXPECT_EQ(bundle->tensors.at("profile.snapkv").shape, profile->shape);
  EXPECT_EQ(bundle->tensors.at("profile.snapkv").data, NpyDataBytes(*profile));
  EXPECT_EQ(bundle->metadata.at("profile.snapkv.manifest"),
            R"({"metric":"snapkv","sink":0,"window":32})");
}

TEST(CliProfileTest, GreedyIsNearExactOnCalibrationData) {  // lukv.md §9 item 7
  std::unique_ptr<lukv::ProfileBuilder> builder;
  ProfileCommandOptions options = SampleOptions();
  options.dumps.resize(1);
  ASSERT_TRUE(BuildProfile(options, &builder, nullptr).ok());
  auto dump = ReadCalibrationDump(options.dumps[0]);
  ASSERT_TRUE(dump.ok()) << dump.status();
  auto d = builder->RawGains(*dump);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<std::vector<double>> raw, gains, relaxed;
  double bound = 0;
  for (const std::vector<double>& head : *d) {
    raw.push_back(lukv::RawLossCurve(head));
    gains.push_back(lukv::AntitonicPava(head));
    relaxed.push_back(lukv::SurrogateCurve(raw.back()[0], gains.back()));
    for (size_t i = 0; i < raw.back().size(); ++i) {
      bound = std::max(bound, raw.back()[i] - relaxed.back()[i]);
    }
  }
  const int64_t heads = 20, T = 200, floor = lukv::RetentionFloor(T);
  std::vector<int64_t> budgets;
  for (int row : {89, 79, 49, 19}) budgets.push_back(lukv::GridBudget(row, heads, T));
  const auto alloc = lukv::GreedyAllocate(gains, floor, budgets);
  for (size_t i = 0; i < budgets.size(); ++i) {
    const lukv::DpSolution relaxed_dp = lukv::SolveMckpExact(relaxed, budgets[i], floor);
    const lukv::DpSolution raw_dp = lukv::SolveMckpExact(raw, budgets[i], floor);
    ASSERT_TRUE(relaxed_dp.feasible && raw_dp.feasible);
    EXPECT_NEAR(lukv::CurvesValue(relaxed, alloc[i]), relaxed_dp.value, 1e-12);
    const double gap = lukv::CurvesValue(raw, alloc[i]) - raw_dp.value;
    EXPECT_GE(gap, -1e-12);
    EXPECT_LE(gap, bound + 1e-12) << "B " << budgets[i];
  }
}

TEST(CliProfileTest, RunProfileWritesNpyAndManifest) {
  ProfileCommandOptions options = SampleOptions();
  options.out = kvtrim::testing::TestPath("cli_profile_test.npy");
  std::ostringstream out, err;
  ASSERT_EQ(RunProfile(options, out, err), kExitOk) << err.str();
  EXPECT_NE(out.str().find("[99, 5, 4]"), std::string::npos) << out.str();
  EXPECT_NE(err.str().find("20/20 layers"), std::string::npos) << err.str();
  EXPECT_EQ(ReadText(options.out), ReadText(SamplesDir() + "/stories260k_lukv_snapkv.npy"));
  const std::string manifest = ReadText(options.out + ".json");
  for (const char* key : {"\"model\": \"stories260K\"", "\"num_layers\": 5", "\"num_kv_heads\": 4",
                          "\"metric\": \"snapkv\"", "\"sink\": 0", "\"window\": 32",
                          "\"grid\": \"0.01:0.99:0.01\"", "\"calib_T\": 200", "\"M\": 4",
                          "\"min_retention\": 0.01", "\"oracle_norm\": \"l2\"",
                          "\"gqa_agg\": \"mean\"", "\"layer_norm\": true", "\"k_max\": 128",
                          "\"sha256\": "}) {
    EXPECT_NE(manifest.find(key), std::string::npos) << key << "\n" << manifest;
  }
  std::remove(options.out.c_str());
  std::remove((options.out + ".json").c_str());
}

TEST(CliProfileTest, UsageErrors) {
  std::ostringstream out, err;
  ProfileCommandOptions options = SampleOptions();
  EXPECT_EQ(RunProfile(options, out, err), kExitUsage);  // no --out
  options.out = kvtrim::testing::TestPath("never_written.npy");
  options.metric = "expected_attention";
  EXPECT_EQ(RunProfile(options, out, err), kExitUsage);
  EXPECT_NE(err.str().find("needs a registered model"), std::string::npos) << err.str();
  options.metric = "snapkv";
  options.gqa_agg = "median";
  EXPECT_EQ(RunProfile(options, out, err), kExitUsage);
  options.gqa_agg = "mean";
  options.params = "kernel=4";
  EXPECT_EQ(RunProfile(options, out, err), kExitUsage);
  options.params = "";
  options.dumps = {SamplesDir() + "/no_such_dump.safetensors"};
  EXPECT_EQ(RunProfile(options, out, err), kExitUsage);
  EXPECT_EQ(ReadCalibrationDump(options.dumps[0]).status().code(), absl::StatusCode::kNotFound);
  // The prefill sample is not a calibration dump: its tensors are layer.{i}.*.
  EXPECT_EQ(ReadCalibrationDump(KVTRIM_SAMPLE_PATH).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::ifstream never(options.out);
  EXPECT_FALSE(never.good());
}

}  // namespace
}  // namespace kvtrim::lukv_profile
