// Tests of kvtrim::Client and kvtrim::Session against an in-process fake kvtrim server:
// status codes and messages, deadlines, the message-size cap, health and the session flow.
#include "client/kvtrim_client.h"

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"

namespace kvtrim {
namespace {

/// The answer of the fake server for one layer: keeps tokens 0..k-1 of every head.
v1::LayerResult FakeResult(const v1::LayerInput& layer, int64_t k) {
  v1::LayerResult result;
  result.set_layer_id(layer.layer_id());
  const int64_t heads = layer.keys().shape(0), n = layer.keys().shape(1);
  result.set_num_tokens(n);
  result.set_output_shape(v1::PER_HEAD);
  result.add_offsets(0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < std::min(k, n); ++i) result.add_indices(static_cast<int32_t>(i));
    result.add_offsets(result.indices_size());
    result.add_heads()->set_kept(static_cast<int32_t>(std::min(k, n)));
  }
  return result;
}

/// A fake kvtrim service: policy "bad" is INVALID_ARGUMENT, policy "slow" sleeps 2 s,
/// layer_id 99 in a session is INVALID_ARGUMENT; 98 sends a SessionError (RESOURCE_EXHAUSTED)
/// and ends the call CANCELLED; everything else keeps the first k tokens.
class FakeKvtrim final : public v1::Kvtrim::Service {
 public:
  grpc::Status ListPolicies(grpc::ServerContext*, const v1::ListPoliciesRequest*,
                            v1::ListPoliciesResponse* response) override {
    response->add_policies()->set_name("fake");
    response->add_scorers("fake");
    return grpc::Status::OK;
  }

  grpc::Status Compress(grpc::ServerContext*, const v1::CompressRequest* request,
                        v1::CompressResponse* response) override {
    if (request->settings().policy().name() == "bad") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "settings.policy.name: unknown");
    }
    if (request->settings().policy().name() == "slow") {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    for (const v1::LayerInput& layer : request->layers()) {
      *response->add_layers() = FakeResult(layer, request->settings().budget().keep_tokens());
    }
    response->set_backend("fake");
    return grpc::Status::OK;
  }

  grpc::Status CompressSession(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream) override {
    v1::SessionRequest request;
    if (!stream->Read(&request) || !request.has_begin()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "begin: missing");
    }
    const int64_t k = request.begin().budget().keep_tokens();
    v1::SessionSummary summary;
    while (stream->Read(&request)) {
      if (request.has_finish()) {
        summary.set_backend("fake");
        v1::SessionResponse response;
        *response.mutable_finished() = summary;
        stream->Write(response);
        return grpc::Status::OK;
      }
      if (request.layer().layer_id() == 99) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "layer.layer_id: 99 is bad");
      }
      if (request.layer().layer_id() == 98) {
        // As kvtrimd ends a session whose backend failed while it was still reading: the
        // failure as the last message, the call itself cancelled.
        v1::SessionResponse failure;
        failure.mutable_error()->set_code(
            static_cast<int32_t>(grpc::StatusCode::RESOURCE_EXHAUSTED));
        failure.mutable_error()->set_message("layer: out of device memory (scripted)");
        stream->Write(failure);
        return grpc::Status(grpc::StatusCode::CANCELLED, "Cancelled");
      }
      v1::SessionResponse response;
      *response.mutable_layer() = FakeResult(request.layer(), k);
      summary.set_layers(summary.layers() + 1);
      stream->Write(response);
    }
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "finish: missing");
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    builder.SetMaxReceiveMessageSize(64 << 20);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    server_->GetHealthCheckService()->SetServingStatus(Client::kHealthServiceName, true);
    target_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    auto client = Client::Connect(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static v1::LayerInput Layer(int32_t id, int64_t heads, int64_t n) {
    v1::LayerInput layer;
    layer.set_layer_id(id);
    layer.mutable_keys()->set_dtype(v1::DTYPE_F32);
    layer.mutable_keys()->add_shape(heads);
    layer.mutable_keys()->add_shape(n);
    layer.mutable_keys()->add_shape(2);
    layer.mutable_keys()->set_inline_data(std::string(heads * n * 2 * 4, '\0'));
    return layer;
  }

  static v1::CompressionSettings Settings(const std::string& policy, int64_t k) {
    v1::CompressionSettings settings;
    settings.mutable_policy()->set_name(policy);
    settings.mutable_budget()->set_keep_tokens(k);
    return settings;
  }

  FakeKvtrim service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(ClientTest, ConnectRejectsBadArguments) {
  EXPECT_EQ(Client::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.max_message_bytes = 0;
  EXPECT_EQ(Client::Connect(target_, options).status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions plaintext_with_name;
  plaintext_with_name.tls_server_name = "kvtrim.kvtrim.svc";  // a TLS option without TLS
  const auto named = Client::Connect(target_, plaintext_with_name);
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(named.status().message().find("tls_server_name"), std::string::npos);
}

TEST_F(ClientTest, ConnectWithTimeoutFailsOnAClosedPort) {
  ClientOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  auto client = Client::Connect("127.0.0.1:1", options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("could not connect to 127.0.0.1:1"), std::string::npos);
}

TEST_F(ClientTest, HealthReportsServingAndUnknownService) {
  auto client = Connect();
  absl::StatusOr<HealthState> state = client->Health();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, HealthState::kServing);
  server_->GetHealthCheckService()->SetServingStatus(Client::kHealthServiceName, false);
  EXPECT_EQ(*client->Health(), HealthState::kNotServing);
  EXPECT_EQ(client->Health("no.such.Service").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, UnaryCallsReturnResultsAndServerErrors) {
  auto client = Connect();
  absl::StatusOr<v1::ListPoliciesResponse> policies = client->ListPolicies();
  ASSERT_TRUE(policies.ok()) << policies.status();
  EXPECT_EQ(policies->policies(0).name(), "fake");

  v1::CompressRequest request;
  *request.mutable_settings() = Settings("fake", 3);
  *request.add_layers() = Layer(0, 2, 10);
  absl::StatusOr<v1::CompressResponse> response = client->Compress(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->layers(0).heads(1).kept(), 3);

  request.mutable_settings()->mutable_policy()->set_name("bad");
  response = client->Compress(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(response.status().message(), "settings.policy.name: unknown");
}

TEST_F(ClientTest, DefaultDeadlineApplies) {
  ClientOptions options;
  options.default_deadline = absl::Milliseconds(200);
  auto client = Connect(options);
  v1::CompressRequest request;
  *request.mutable_settings() = Settings("slow", 1);
  EXPECT_EQ(client->Compress(request).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ClientTest, MaxMessageSizeIsEnforcedOnTheChannel) {
  ClientOptions options;
  options.max_message_bytes = 1 << 10;
  auto client = Connect(options);
  v1::CompressRequest request;
  *request.mutable_settings() = Settings("fake", 1);
  *request.add_layers() = Layer(0, 4, 256);  // 8 KiB of keys
  EXPECT_EQ(client->Compress(request).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ClientTest, SessionCollectsEveryLayerAndTheSummary) {
  auto client = Connect();
  absl::StatusOr<std::unique_ptr<Session>> session = client->OpenSession(Settings("fake", 4));
  ASSERT_TRUE(session.ok()) << session.status();
  for (int32_t id = 0; id < 3; ++id) ASSERT_TRUE((*session)->SendLayer(Layer(id, 2, 8)).ok());
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->layers.size(), 3u);
  EXPECT_EQ(result->summary.layers(), 3);
  EXPECT_EQ(result->summary.backend(), "fake");
  EXPECT_EQ(result->round_trip_seconds.size(), 3u);
  for (const auto& [id, seconds] : result->round_trip_seconds) EXPECT_GE(seconds, 0.0) << id;
  EXPECT_EQ((*session)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*session)->SendLayer(Layer(5, 1, 1)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ClientTest, SessionReturnsTheServersErrorStatus) {
  auto client = Connect();
  absl::StatusOr<std::unique_ptr<Session>> session = client->OpenSession(Settings("fake", 4));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->SendLayer(Layer(0, 2, 8)).ok());
  absl::Status status = (*session)->SendLayer(Layer(99, 2, 8));
  // The rejection shows on a later write or at Finish, whichever comes first.
  for (int i = 0; status.ok() && i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    status = (*session)->SendLayer(Layer(100 + i, 2, 8));
  }
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "layer.layer_id: 99 is bad");
  if (!status.ok()) {
    EXPECT_EQ(status.message(), "layer.layer_id: 99 is bad");
  }
}

TEST_F(ClientTest, SessionReportsTheFailureOfASessionErrorMessageOverCancelled) {
  auto client = Connect();
  absl::StatusOr<std::unique_ptr<Session>> session = client->OpenSession(Settings("fake", 4));
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->SendLayer(Layer(0, 2, 8)).ok());
  (*session)->SendLayer(Layer(98, 2, 8)).IgnoreError();
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_EQ(result.status().message(), "layer: out of device memory (scripted)");
}

TEST_F(ClientTest, DroppingAnUnfinishedSessionCancelsIt) {
  auto client = Connect();
  absl::StatusOr<std::unique_ptr<Session>> session = client->OpenSession(Settings("fake", 1));
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->SendLayer(Layer(0, 1, 4)).ok());
  session->reset();  // must not hang
  SUCCEED();
}

}  // namespace
}  // namespace kvtrim
