// The remote shape's scale-out with the real kvtrimd binary and kvtrim::Client: two replicas
// sharing one --data_dir behind one target (as a headless Service's DNS name resolves to
// every pod), ClientOptions::load_balancing_policy = "round_robin" spreading Compress calls
// over both, and a model registered through one replica served by the other, which loads it
// from the shared volume on first use.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/kvtrim_client.h"
#include "client/layer_inputs.h"
#include "formats/safetensors.h"
#include "tests/integration/kvtrimd_process.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/testing/model_bundle_fixture.h"
#include "tests/testing/test_dir.h"

namespace kvtrim {
namespace {

using testing::KvtrimdProcess;

/// A model of the bundled sample's layout (5 layers, H_q = 8, H_kv = 4, d = 8).
ModelBundle SampleModel() {
  return testing::BundleFromModelInput(
      testing::MakeTestModelInput(5, 8, 4, 8, 32, 11, /*with_query_stats=*/true));
}

/// The first sample layer under criticalkv (it reads the model's W_O), naming `digest`.
v1::CompressRequest CriticalKvRequest(const std::string& digest) {
  v1::CompressRequest request;
  request.mutable_settings()->mutable_policy()->set_name("criticalkv");
  request.mutable_settings()->mutable_budget()->set_keep_fraction(0.25);
  request.mutable_settings()->set_model_digest(digest);
  request.mutable_settings()->set_num_layers(5);
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(KVTRIM_SAMPLE_PATH);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return request;
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(*file);
  EXPECT_TRUE(layers.ok()) << layers.status();
  if (layers.ok()) *request.add_layers() = (*layers)[0];
  return request;
}

class LoadBalancingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string shared = testing::MakeTestSubdir("shared_data");
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<KvtrimdProcess> process = KvtrimdProcess::Start(
          KVTRIMD_PATH, {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                         "--workers=1", "--backend=cpu", absl::StrCat("--data_dir=", shared)});
      ASSERT_TRUE(process.ok()) << process.status();
      replicas_.push_back(*std::move(process));
    }
    for (KvtrimdProcess& replica : replicas_) {
      absl::StatusOr<testing::KvtrimdAddresses> addresses =
          replica.WaitUntilServing(absl::Seconds(60));
      ASSERT_TRUE(addresses.ok()) << addresses.status();
      addresses_.push_back(*addresses);
    }
  }

  /// "ipv4:127.0.0.1:P1,127.0.0.1:P2": one target naming both replicas.
  std::string BothReplicas() const {
    std::vector<std::string> hosts;
    for (const auto& addresses : addresses_) hosts.push_back(addresses.grpc);
    return absl::StrCat("ipv4:", absl::StrJoin(hosts, ","));
  }

  std::unique_ptr<Client> Connect(const std::string& target, const std::string& policy) {
    ClientOptions options;
    options.load_balancing_policy = policy;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  /// OK Compress calls replica `i` counted (kvtrim_requests_total).
  double CompressCalls(size_t i) {
    absl::StatusOr<std::string> body =
        testing::HttpGet("127.0.0.1", addresses_[i].metrics_port(), "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    if (!body.ok()) return -1;
    absl::StatusOr<std::vector<testing::Sample>> samples = testing::ParseExposition(*body);
    EXPECT_TRUE(samples.ok()) << samples.status();
    if (!samples.ok()) return -1;
    return testing::MetricsSnapshot(*std::move(samples))
        .Sum("kvtrim_requests_total", {{"rpc", "Compress"}, {"code", "OK"}});
  }

  void TearDown() override {
    if (!HasFailure()) return;
    for (const KvtrimdProcess& replica : replicas_) std::cerr << replica.Log() << "\n";
  }

  std::vector<KvtrimdProcess> replicas_;
  std::vector<testing::KvtrimdAddresses> addresses_;
};

TEST_F(LoadBalancingTest, RoundRobinSpreadsCallsAndTheSharedVolumeServesTheModel) {
  std::unique_ptr<Client> registrar = Connect(BothReplicas(), "round_robin");
  ASSERT_NE(registrar, nullptr);
  absl::StatusOr<std::string> digest = registrar->RegisterModel(SampleModel());
  ASSERT_TRUE(digest.ok()) << digest.status();
  // A client that never registered the model (nothing to re-register): the replica that
  // did not receive it must load it from the volume.
  std::unique_ptr<Client> worker = Connect(BothReplicas(), "round_robin");
  ASSERT_NE(worker, nullptr);
  for (int call = 0; call < 8; ++call) {
    absl::StatusOr<v1::CompressResponse> response =
        worker->Compress(CriticalKvRequest(*digest));
    ASSERT_TRUE(response.ok()) << "call " << call << ": " << response.status();
    ASSERT_EQ(response->layers_size(), 1);
  }
  const double first = CompressCalls(0), second = CompressCalls(1);
  EXPECT_EQ(first + second, 8);
  EXPECT_GE(first, 1);  // both replicas answered
  EXPECT_GE(second, 1);
  for (size_t i = 0; i < addresses_.size(); ++i) {  // both hold the model now
    std::unique_ptr<Client> direct = Connect(addresses_[i].grpc, "");
    ASSERT_NE(direct, nullptr);
    absl::StatusOr<v1::ListModelsResponse> models = direct->ListModels();
    ASSERT_TRUE(models.ok()) << models.status();
    ASSERT_EQ(models->models_size(), 1) << "replica " << i;
    EXPECT_EQ(models->models(0).digest(), *digest);
  }
}

TEST_F(LoadBalancingTest, PickFirstStaysOnOneReplica) {
  std::unique_ptr<Client> client = Connect(BothReplicas(), "");
  ASSERT_NE(client, nullptr);
  v1::CompressRequest request = CriticalKvRequest("");
  request.mutable_settings()->mutable_policy()->set_name("knorm");
  for (int call = 0; call < 4; ++call) ASSERT_TRUE(client->Compress(request).ok());
  const double first = CompressCalls(0), second = CompressCalls(1);
  EXPECT_EQ(std::min(first, second), 0);
  EXPECT_EQ(std::max(first, second), 4);
}

TEST(LoadBalancingPolicyTest, AnUnknownPolicyIsRefusedNamingTheOption) {
  ClientOptions options;
  options.load_balancing_policy = "least_request\"}";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect("127.0.0.1:1", options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(client.status().message().find("load_balancing_policy"), std::string::npos);
}

/// How long a fresh plaintext channel to a kvtrimd started with `flags` stays READY without
/// any call on it, watched for up to `watch` (nullopt: READY throughout).
std::optional<absl::Duration> ReadyTimeOfAnIdleChannel(const std::vector<std::string>& flags,
                                                       absl::Duration watch) {
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics_listen=",
                                   "--workers=1", "--backend=cpu"};
  args.insert(args.end(), flags.begin(), flags.end());
  absl::StatusOr<KvtrimdProcess> process = KvtrimdProcess::Start(KVTRIMD_PATH, args);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return absl::ZeroDuration();
  absl::StatusOr<testing::KvtrimdAddresses> addresses =
      process->WaitUntilServing(absl::Seconds(60));
  EXPECT_TRUE(addresses.ok()) << addresses.status();
  if (!addresses.ok()) return absl::ZeroDuration();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(addresses->grpc, grpc::InsecureChannelCredentials());
  EXPECT_TRUE(channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10))));
  const absl::Time connected = absl::Now();
  // Woken by any state change, or at the end of the watch.
  channel->WaitForStateChange(GRPC_CHANNEL_READY, absl::ToChronoTime(connected + watch));
  if (channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) return std::nullopt;
  return absl::Now() - connected;
}

// --max_connection_age_s: kvtrimd closes a connection once it is that old (GOAWAY; gRPC
// 1.51 sends it within a few seconds of a 1 s age), so that a client re-resolves its target
// and reaches replicas added since. Without the flag an idle connection stays up.
TEST(MaxConnectionAgeTest, AnAgedConnectionIsClosedAndAFreshOneIsNot) {
  const std::optional<absl::Duration> aged = ReadyTimeOfAnIdleChannel(
      {"--max_connection_age_s=1", "--max_connection_age_grace_s=1"}, absl::Seconds(20));
  ASSERT_TRUE(aged.has_value()) << "still READY after 20 s";
  EXPECT_GE(*aged, absl::Milliseconds(800));  // not before its age (1 s, -10 % jitter)
  EXPECT_EQ(ReadyTimeOfAnIdleChannel({}, absl::Seconds(8)), std::nullopt);
}

}  // namespace
}  // namespace kvtrim
