// End-to-end model registration with the real kvtrimd binary: a model registered through
// kvtrim::Client survives SIGTERM and a restart on the same --data_dir, a corrupt extra file
// in that directory is skipped with one log line while the server still serves, the client
// re-registers by itself when a restarted server lost the model (unary and session), and
// the `kvtrim` CLI's register-model / models / delete-model / compress --model commands.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/kvtrim_client.h"
#include "client/layer_inputs.h"
#include "formats/safetensors.h"
#include "tests/integration/kvtrimd_process.h"
#include "tests/testing/model_bundle_fixture.h"
#include "tests/testing/test_dir.h"

namespace kvtrim {
namespace {

namespace fs = std::filesystem;
using testing::KvtrimdProcess;
using testing::MakeTestSubdir;
using testing::TestPath;

/// A model matching the bundled sample's layout: 5 layers, H_q = 8, H_kv = 4, d = 8.
ModelBundle SampleModel() {
  ModelInput input = testing::MakeTestModelInput(5, 8, 4, 8, 32, 11, /*with_query_stats=*/true);
  testing::AddTestProfile(&input, "snapkv", "snapkv", 4, 32, 5);
  return testing::BundleFromModelInput(input);
}

std::vector<v1::LayerInput> SampleLayers() {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(KVTRIM_SAMPLE_PATH);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(*file);
  EXPECT_TRUE(layers.ok()) << layers.status();
  return layers.ok() ? *std::move(layers) : std::vector<v1::LayerInput>{};
}

/// knorm over every sample layer, naming `digest`.
v1::CompressRequest KnormRequest(const std::string& digest) {
  v1::CompressRequest request;
  request.mutable_settings()->mutable_policy()->set_name("knorm");
  request.mutable_settings()->mutable_budget()->set_keep_fraction(0.25);
  request.mutable_settings()->set_model_digest(digest);
  for (v1::LayerInput& layer : SampleLayers()) *request.add_layers() = std::move(layer);
  return request;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

class ModelRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTestSubdir("models");
    // A unix socket in this test's own directory: no port to race for, and a restarted
    // kvtrimd comes back at the same address, as the client's re-registration needs.
    target_ = absl::StrCat("unix:", TestPath("kvtrimd.sock"));
    client_ = NewClient();
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "---- kvtrimd logs ----\n" << logs_ << "----------------------\n";
    if (process_.has_value()) {
      logs_.clear();
      process_.reset();
    }
  }

  std::unique_ptr<Client> NewClient() {
    ClientOptions options;
    options.default_deadline = absl::Seconds(30);
    options.register_chunk_bytes = 1000;  // several chunks per weight
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  /// Starts kvtrimd on target_ with `data_dir` ("" = in memory) and waits for SERVING.
  void Start(const std::string& data_dir) {
    absl::StatusOr<KvtrimdProcess> process = KvtrimdProcess::Start(
        KVTRIMD_PATH,
        {absl::StrCat("--listen=", target_), "--metrics_listen=", "--workers=1",
         "--backend=cpu", absl::StrCat("--data_dir=", data_dir)});
    ASSERT_TRUE(process.ok()) << process.status();
    process_.emplace(*std::move(process));
    absl::StatusOr<testing::KvtrimdAddresses> addresses =
        process_->WaitUntilServing(absl::Seconds(60));
    ASSERT_TRUE(addresses.ok()) << addresses.status();
    ASSERT_EQ(addresses->grpc, target_);
    // The client's channel may still be backing off from the previous server: wait until
    // it reconnects (bounded).
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<HealthState> state = client_->Health();
      if (state.ok() && *state == HealthState::kServing) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "client did not reach the SERVING kvtrimd within 30 s:\n" << process_->Log();
  }

  /// SIGTERM; kvtrimd must drain and exit 0. Keeps its log for failure reports.
  void Stop() {
    ASSERT_TRUE(process_.has_value());
    absl::StatusOr<int> status = process_->StopWith(SIGTERM, absl::Seconds(30));
    logs_ += process_->Log();
    process_.reset();
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 0);
  }

  std::string dir_;
  std::string target_;
  std::unique_ptr<Client> client_;
  std::optional<KvtrimdProcess> process_;
  std::string logs_;
};

TEST_F(ModelRestartTest, ModelSurvivesRestartAndACorruptFileIsSkipped) {
  ASSERT_NO_FATAL_FAILURE(Start(dir_));
  absl::StatusOr<std::string> digest = client_->RegisterModel(SampleModel());
  ASSERT_TRUE(digest.ok()) << digest.status();
  ASSERT_TRUE(client_->Compress(KnormRequest(*digest)).ok());
  ASSERT_NO_FATAL_FAILURE(Stop());

  // One extra, truncated model file under another (well-formed) digest name.
  const std::string good = dir_ + "/" + digest->substr(7) + ".kvtmodel";
  ASSERT_TRUE(fs::exists(good));
  const std::string corrupt = dir_ + "/" + std::string(64, 'a') + ".kvtmodel";
  fs::copy_file(good, corrupt);
  fs::resize_file(corrupt, fs::file_size(good) / 2);

  ASSERT_NO_FATAL_FAILURE(Start(dir_));
  const std::string log = process_->Log();
  EXPECT_EQ(CountOccurrences(log, "kvtrimd: skipping model file " + corrupt + ": "), 1) << log;
  EXPECT_EQ(CountOccurrences(log, "skipping model file"), 1) << log;
  EXPECT_NE(log.find("models 1 (loaded from " + dir_ + ")"), std::string::npos) << log;

  // A client that never registered anything: the model really came from disk.
  std::unique_ptr<Client> fresh = NewClient();
  absl::StatusOr<v1::ListModelsResponse> listed = fresh->ListModels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->models_size(), 1);
  EXPECT_EQ(listed->models(0).digest(), *digest);
  EXPECT_EQ(listed->models(0).header().num_layers(), 5);
  absl::StatusOr<v1::CompressResponse> response = fresh->Compress(KnormRequest(*digest));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->layers_size(), 5);
  absl::StatusOr<v1::CompressResponse> unknown =
      fresh->Compress(KnormRequest("sha256:" + std::string(64, 'b')));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unknown.status().message().find("unknown model digest"), std::string::npos);
  ASSERT_NO_FATAL_FAILURE(Stop());
}

TEST_F(ModelRestartTest, ClientReregistersWhenARestartedServerLostTheModel) {
  ASSERT_NO_FATAL_FAILURE(Start(""));
  absl::StatusOr<std::string> digest = client_->RegisterModel(SampleModel());
  ASSERT_TRUE(digest.ok()) << digest.status();
  ASSERT_NO_FATAL_FAILURE(Stop());

  // In memory only: the restarted server does not know the digest; Compress recovers.
  ASSERT_NO_FATAL_FAILURE(Start(""));
  absl::StatusOr<v1::CompressResponse> response = client_->Compress(KnormRequest(*digest));
  ASSERT_TRUE(response.ok()) << response.status();
  absl::StatusOr<v1::ListModelsResponse> listed = client_->ListModels();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->models_size(), 1);
  EXPECT_EQ(listed->models(0).digest(), *digest);
  ASSERT_NO_FATAL_FAILURE(Stop());

  // Again, through a session.
  ASSERT_NO_FATAL_FAILURE(Start(""));
  v1::CompressRequest request = KnormRequest(*digest);
  absl::StatusOr<std::unique_ptr<Session>> session = client_->OpenSession(request.settings());
  ASSERT_TRUE(session.ok()) << session.status();
  for (const v1::LayerInput& layer : request.layers()) {
    ASSERT_TRUE((*session)->SendLayer(layer).ok());
  }
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->summary.layers(), 5);
  ASSERT_NO_FATAL_FAILURE(Stop());
}

/// Runs the kvtrim CLI with `args`; returns its exit status, stdout + stderr in `output`.
int RunCli(const std::string& args, std::string* output) {
  FILE* pipe = popen((std::string(KVTRIM_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(ModelRestartTest, CliRegistersListsDeletesAndCompressesWithAModel) {
  ASSERT_NO_FATAL_FAILURE(Start(dir_));
  const std::string bundle = TestPath("cli_bundle.safetensors");
  ASSERT_TRUE(WriteModelBundle(bundle, SampleModel()).ok());
  const std::string target = absl::StrCat("--target=", target_);

  std::string out;
  ASSERT_EQ(RunCli(absl::StrCat(target, " register-model --model=", bundle), &out), 0) << out;
  ASSERT_EQ(out.rfind("sha256:", 0), 0u) << out;
  const std::string digest = out.substr(0, out.find('\n'));
  EXPECT_EQ(digest.size(), 7u + 64u);

  out.clear();
  ASSERT_EQ(RunCli(absl::StrCat(target, " models"), &out), 0) << out;
  EXPECT_NE(out.find(digest), std::string::npos) << out;
  EXPECT_NE(out.find("layers=5 query_heads=8 kv_heads=4 head_dim=8"), std::string::npos) << out;

  out.clear();
  ASSERT_EQ(RunCli(absl::StrCat(target, " compress --policy=laprox --keep_fraction=0.25 --input=",
                                KVTRIM_SAMPLE_PATH, " --model=", bundle, " --numerics=fast"),
                   &out),
            0)
      << out;
  EXPECT_NE(out.find("model " + digest), std::string::npos) << out;
  // Fast asked for; the CPU backend computed every layer fast and each layer says so.
  EXPECT_NE(out.find("numerics_asked=fast"), std::string::npos) << out;
  EXPECT_NE(out.find("layer 4  n=256  output=PER_HEAD  numerics=fast"), std::string::npos)
      << out;
  // --summary: the same compression as one table row over every layer and KV head, after its
  // header; no per-layer report and no model line.
  out.clear();
  ASSERT_EQ(RunCli(absl::StrCat(target, " compress --policy=laprox --keep_fraction=0.25 --input=",
                                KVTRIM_SAMPLE_PATH, " --model=", bundle,
                                " --session --summary --summary_header"),
                   &out),
            0)
      << out;
  EXPECT_EQ(out.rfind("policy           keep            kept tokens         perturbation", 0),
            0u)
      << out;
  EXPECT_NE(out.find("\nlaprox           0.25            1280/5120 (25.0%) "), std::string::npos)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  // An error-targeted budget: its row names epsilon and the mean perturbation is within it.
  out.clear();
  ASSERT_EQ(RunCli(absl::StrCat(target, " compress --policy=dropkv --max_perturbation=0.2 --input=",
                                KVTRIM_SAMPLE_PATH, " --summary"),
                   &out),
            0)
      << out;
  ASSERT_EQ(out.rfind("dropkv           eps=0.2         ", 0), 0u) << out;
  std::istringstream row(out.substr(33));
  std::string kept, percent;
  double perturbation = -1;
  row >> kept >> percent >> perturbation;
  EXPECT_GT(perturbation, 0) << out;
  EXPECT_LE(perturbation, 0.2) << out;
  out.clear();
  EXPECT_EQ(RunCli(absl::StrCat(target, " compress --policy=knorm --keep_fraction=0.25 --input=",
                                KVTRIM_SAMPLE_PATH, " --numerics=quick"),
                   &out),
            2)
      << out;
  EXPECT_NE(out.find("--numerics: \"quick\" is not fast or exact"), std::string::npos) << out;

  out.clear();
  ASSERT_EQ(RunCli(absl::StrCat(target, " delete-model ", digest), &out), 0) << out;
  out.clear();
  EXPECT_EQ(RunCli(absl::StrCat(target, " delete-model ", digest), &out), 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCli(absl::StrCat(target, " delete-model"), &out), 2) << out;
  out.clear();
  EXPECT_EQ(RunCli(absl::StrCat(target, " register-model --model=", dir_, "/missing"), &out), 2)
      << out;
  fs::remove(bundle);
  ASSERT_NO_FATAL_FAILURE(Stop());
}

}  // namespace
}  // namespace kvtrim
