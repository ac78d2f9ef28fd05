// kvtrim::Client model registration against an in-process fake server: chunked
// RegisterModel streams, ListModels / DeleteModel, and the automatic re-registration and
// single retry after "unknown model digest" (unary Compress and sessions).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/kvtrim_client.h"
#include "tests/testing/model_bundle_fixture.h"

namespace kvtrim {
namespace {

/// What the fake received in one RegisterModel stream.
struct Received {
  v1::ModelHeader header;
  std::map<std::string, std::string> bytes;     // reassembled weights
  std::map<std::string, std::string> manifest;  // from each weight's first chunk
  std::vector<v1::ModelWeightChunk> chunks;     // data stripped
  size_t max_chunk = 0;
};

/// A fake kvtrim server that registers models under a content hash, forgets them on demand
/// (a restart without a data directory), and fails Compress / sessions that name a digest it
/// does not hold exactly as kvtrimd does. Session policy "late" answers every layer at
/// finish; "reject_at_finish" checks the digest only when `finish` arrives (so every layer
/// has been sent by then); "fail_after_first" answers layer 0 and then fails "unknown model
/// digest".
class FakeModelServer final : public v1::Kvtrim::Service {
 public:
  grpc::Status RegisterModel(grpc::ServerContext*, grpc::ServerReader<v1::RegisterModelRequest>* reader,
                             v1::RegisterModelResponse* response) override {
    Received r;
    v1::RegisterModelRequest message;
    bool first = true;
    while (reader->Read(&message)) {
      if (first != message.has_header()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "header: first and once");
      }
      first = false;
      if (message.has_header()) {
        r.header = message.header();
        continue;
      }
      const v1::ModelWeightChunk& c = message.weight();
      std::string& bytes = r.bytes[c.name()];
      if (c.offset_bytes() != bytes.size()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "offset_bytes: not contiguous");
      }
      bytes += c.data();
      if (c.offset_bytes() == 0) r.manifest[c.name()] = c.manifest_json();
      r.max_chunk = std::max(r.max_chunk, c.data().size());
      v1::ModelWeightChunk stripped = c;
      stripped.clear_data();
      r.chunks.push_back(stripped);
    }
    // A content hash standing in for SHA-256 (the fake only needs determinism).
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&h](const std::string& s) {
      for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
    };
    mix(r.header.SerializeAsString());
    for (const auto& [name, bytes] : r.bytes) {
      mix(name);
      mix(bytes);
    }
    const std::string digest = absl::StrFormat("sha256:%016x%048d", h, 0);
    std::lock_guard<std::mutex> lock(mutex_);
    ++registrations_;
    known_.insert(digest);
    last_ = std::move(r);
    response->set_digest(digest);
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* response) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& digest : known_) response->add_models()->set_digest(digest);
    return grpc::Status::OK;
  }

  grpc::Status DeleteModel(grpc::ServerContext*, const v1::DeleteModelRequest* request,
                           v1::DeleteModelResponse*) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (known_.erase(request->digest()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "digest: no model");
    }
    return grpc::Status::OK;
  }

  grpc::Status Compress(grpc::ServerContext*, const v1::CompressRequest* request,
                        v1::CompressResponse* response) override {
    ++compress_calls_;
    if (!Knows(request->settings().model_digest())) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("settings.model_digest: unknown model digest '",
                                       request->settings().model_digest(), "'"));
    }
    for (const auto& layer : request->layers()) {
      response->add_layers()->set_layer_id(layer.layer_id());
    }
    return grpc::Status::OK;
  }

  grpc::Status CompressSession(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream) override {
    ++sessions_;
    v1::SessionRequest request;
    if (!stream->Read(&request) || !request.has_begin()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "begin: missing");
    }
    const std::string policy = request.begin().policy().name();
    const bool known = Knows(request.begin().model_digest());
    if (!known && policy != "reject_at_finish") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "begin.model_digest: unknown model digest");
    }
    std::vector<int32_t> pending;
    v1::SessionSummary summary;
    while (stream->Read(&request)) {
      if (request.has_finish()) {
        if (!known) {
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "begin.model_digest: unknown model digest");
        }
        for (int32_t id : pending) {
          v1::SessionResponse response;
          response.mutable_layer()->set_layer_id(id);
          stream->Write(response);
        }
        v1::SessionResponse response;
        *response.mutable_finished() = summary;
        stream->Write(response);
        return grpc::Status::OK;
      }
      summary.set_layers(summary.layers() + 1);
      const int32_t id = request.layer().layer_id();
      if (policy == "late" || policy == "reject_at_finish") {
        pending.push_back(id);
        continue;
      }
      v1::SessionResponse response;
      response.mutable_layer()->set_layer_id(id);
      stream->Write(response);
      if (policy == "fail_after_first") {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "layer: unknown model digest (simulated after an answer)");
      }
    }
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "finish: missing");
  }

  /// Forgets every model (a restart without --data_dir).
  void Forget() {
    std::lock_guard<std::mutex> lock(mutex_);
    known_.clear();
  }
  /// When set, the server never finds a digest (registrations still "succeed").
  void set_amnesia(bool amnesia) { amnesia_ = amnesia; }
  int registrations() {
    std::lock_guard<std::mutex> lock(mutex_);
    return registrations_;
  }
  Received last() {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_;
  }
  std::atomic<int> compress_calls_{0};
  std::atomic<int> sessions_{0};

 private:
  bool Knows(const std::string& digest) {
    if (digest.empty()) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    return !amnesia_ && known_.count(digest) != 0;
  }

  std::mutex mutex_;
  std::set<std::string> known_;
  int registrations_ = 0;
  Received last_;
  std::atomic<bool> amnesia_{false};
};

class ModelRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", port);
    Connect(ClientOptions());
    ModelInput input = testing::MakeTestModelInput(2, 4, 2, 8, 16, 9, true);
    testing::AddTestProfile(&input, "snapkv", "snapkv", 4, 32, 2);
    bundle_ = testing::BundleFromModelInput(input);
  }
  void TearDown() override { server_->Shutdown(); }

  void Connect(ClientOptions options) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target_, options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  v1::CompressRequest Request(const std::string& digest, int layers = 2) {
    v1::CompressRequest r;
    r.mutable_settings()->mutable_policy()->set_name("knorm");
    r.mutable_settings()->set_model_digest(digest);
    for (int i = 0; i < layers; ++i) r.add_layers()->set_layer_id(i);
    return r;
  }

  FakeModelServer service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::unique_ptr<Client> client_;
  ModelBundle bundle_;
};

TEST_F(ModelRegistrationTest, StreamsHeaderThenContiguousChunks) {
  ClientOptions options;
  options.register_chunk_bytes = 100;
  Connect(options);
  absl::StatusOr<std::string> digest = client_->RegisterModel(bundle_);
  ASSERT_TRUE(digest.ok()) << digest.status();
  const Received r = service_.last();
  EXPECT_EQ(r.header.SerializeAsString(), bundle_.header.SerializeAsString());
  EXPECT_EQ(r.max_chunk, 100u);
  ASSERT_EQ(r.bytes.size(), bundle_.weights.size());
  for (const auto& [name, tensor] : bundle_.weights) EXPECT_EQ(r.bytes.at(name), tensor.data);
  EXPECT_EQ(r.manifest.at("profile.snapkv"), bundle_.manifests.at("profile.snapkv"));
  EXPECT_EQ(r.manifest.at("layers.0.w_o"), "");
  for (const v1::ModelWeightChunk& c : r.chunks) {
    // dtype and shape on each weight's first chunk only.
    EXPECT_EQ(c.offset_bytes() == 0, c.dtype() != v1::DTYPE_UNSPECIFIED) << c.name();
    EXPECT_EQ(c.offset_bytes() == 0, c.shape_size() > 0) << c.name();
  }
  // The same content registers under the same digest.
  EXPECT_EQ(*client_->RegisterModel(bundle_), *digest);
}

TEST_F(ModelRegistrationTest, ChunksStayBelowTheMessageCap) {
  ClientOptions options;
  options.max_message_bytes = 200 << 10;
  options.register_chunk_bytes = 1 << 20;
  Connect(options);
  bundle_.weights["layers.0.w_o"].data.resize(1 << 20);  // the fake checks no shapes
  ASSERT_TRUE(client_->RegisterModel(bundle_).ok());
  EXPECT_EQ(service_.last().max_chunk, size_t{(200 << 10) - (64 << 10)});
}

TEST_F(ModelRegistrationTest, ListAndDelete) {
  const std::string digest = *client_->RegisterModel(bundle_);
  absl::StatusOr<v1::ListModelsResponse> listed = client_->ListModels();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->models_size(), 1);
  EXPECT_EQ(listed->models(0).digest(), digest);
  ASSERT_TRUE(client_->DeleteModel(digest).ok());
  EXPECT_EQ(client_->DeleteModel(digest).code(), absl::StatusCode::kNotFound);
  // Deleted on purpose: the client no longer re-registers it.
  absl::StatusOr<v1::CompressResponse> response = client_->Compress(Request(digest));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(service_.registrations(), 1);
}

TEST_F(ModelRegistrationTest, CompressReregistersOnceAfterTheServerForgot) {
  const std::string digest = *client_->RegisterModel(bundle_);
  service_.Forget();
  absl::StatusOr<v1::CompressResponse> response = client_->Compress(Request(digest));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->layers_size(), 2);
  EXPECT_EQ(service_.registrations(), 2);
  EXPECT_EQ(service_.compress_calls_.load(), 2);
}

TEST_F(ModelRegistrationTest, CompressRetriesOnlyOnce) {
  const std::string digest = *client_->RegisterModel(bundle_);
  service_.set_amnesia(true);
  absl::StatusOr<v1::CompressResponse> response = client_->Compress(Request(digest));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(response.status().message().find("unknown model digest"), std::string::npos);
  EXPECT_EQ(service_.registrations(), 2);
  EXPECT_EQ(service_.compress_calls_.load(), 2);
}

TEST_F(ModelRegistrationTest, UnknownDigestNotRegisteredHereIsReturned) {
  absl::StatusOr<v1::CompressResponse> response =
      client_->Compress(Request("sha256:" + std::string(64, '1')));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(service_.registrations(), 0);
  EXPECT_EQ(service_.compress_calls_.load(), 1);
}

/// Opens a session with `policy` naming `digest`, sends layers 0..layers-1, finishes.
absl::StatusOr<SessionResult> RunSession(Client& client, const std::string& digest,
                                         const std::string& policy, int layers) {
  v1::CompressionSettings settings;
  settings.mutable_policy()->set_name(policy);
  settings.set_model_digest(digest);
  absl::StatusOr<std::unique_ptr<Session>> session = client.OpenSession(settings);
  if (!session.ok()) return session.status();
  for (int i = 0; i < layers; ++i) {
    v1::LayerInput layer;
    layer.set_layer_id(i);
    layer.mutable_keys()->set_inline_data(std::string(1000, 'k'));
    if (absl::Status st = (*session)->SendLayer(std::move(layer)); !st.ok()) return st;
  }
  return (*session)->Finish();
}

TEST_F(ModelRegistrationTest, SessionReregistersAndReplaysBeforeAnyAnswer) {
  const std::string digest = *client_->RegisterModel(bundle_);
  for (const char* policy : {"knorm", "late"}) {
    SCOPED_TRACE(policy);
    service_.Forget();
    const int before = service_.registrations();
    absl::StatusOr<SessionResult> result = RunSession(*client_, digest, policy, 3);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->layers.size(), 3u);
    EXPECT_EQ(result->summary.layers(), 3);
    EXPECT_EQ(service_.registrations(), before + 1);
  }
}

TEST_F(ModelRegistrationTest, SessionDoesNotRetryAfterAnAnswer) {
  const std::string digest = *client_->RegisterModel(bundle_);
  absl::StatusOr<SessionResult> result = RunSession(*client_, digest, "fail_after_first", 3);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(service_.registrations(), 1);
  EXPECT_EQ(service_.sessions_.load(), 1);
}

TEST_F(ModelRegistrationTest, SessionDoesNotReplayMoreThanItsBuffer) {
  ClientOptions options;
  options.session_replay_bytes = 1500;  // less than two 1000-byte layers
  Connect(options);
  const std::string digest = *client_->RegisterModel(bundle_);
  service_.Forget();
  absl::StatusOr<SessionResult> result = RunSession(*client_, digest, "reject_at_finish", 3);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(service_.registrations(), 1);
  // One layer fits: the retry happens.
  service_.Forget();
  result = RunSession(*client_, digest, "reject_at_finish", 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(service_.registrations(), 2);
}

TEST_F(ModelRegistrationTest, OptionsAreChecked) {
  ClientOptions options;
  options.register_chunk_bytes = 0;
  EXPECT_EQ(Client::Connect(target_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtrim
