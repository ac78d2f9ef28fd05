// Tests of RegionLease and of the client id metadata and chunked session layers, against an
// in-process fake kvtrim server (no real regions: the fake only checks the protocol).
#include "client/regions.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/kvtrim_client.h"

namespace kvtrim {
namespace {

/// The `kvtrim-client-id` metadata of a call ("" when absent).
std::string ClientIdOf(const grpc::ServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kClientIdMetadataKey);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
}

/// A fake server. Regions: lease "client-7"; host_shm "/bad" fails INVALID_ARGUMENT in its
/// answer, "/noise" is preceded by an answer of another tag, "/die" ends the stream
/// RESOURCE_EXHAUSTED; cuda_ipc checks the handle and uuid sizes; unknown unregistered ids
/// are NOT_FOUND. With `refuse`, the call fails FAILED_PRECONDITION at once.
/// Compress / CompressSession record the client id; the session reassembles chunked keys
/// and answers num_tokens = the keys' byte count.
class FakeKvtrim final : public v1::Kvtrim::Service {
 public:
  grpc::Status Regions(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::RegionResponse, v1::RegionRequest>* stream) override {
    if (refuse) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "Regions: kvtrimd runs without --allow_client_shm");
    }
    v1::RegionResponse lease;
    lease.mutable_lease()->set_client_id("client-7");
    lease.mutable_lease()->set_max_regions(4);
    stream->Write(lease);
    std::map<std::string, bool> held;
    int next = 0;
    v1::RegionRequest request;
    while (stream->Read(&request)) {
      v1::RegionResponse response;
      response.set_tag(request.tag());
      if (request.has_unregister_region()) {
        const std::string& id = request.unregister_region().region_id();
        if (held.erase(id) == 1) {
          response.set_unregistered_region_id(id);
        } else {
          response.set_code(grpc::StatusCode::NOT_FOUND);
          response.set_message(absl::StrCat("unregister_region.region_id: \"", id, "\""));
        }
      } else if (request.register_region().has_host_shm()) {
        const std::string& name = request.register_region().host_shm().name();
        if (name == "/die") return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "gone");
        if (name == "/noise") {
          v1::RegionResponse noise;
          noise.set_tag(request.tag() + 1000);
          noise.set_registered_region_id("not-yours");
          stream->Write(noise);
        }
        if (name == "/bad") {
          response.set_code(grpc::StatusCode::INVALID_ARGUMENT);
          response.set_message("register_region.host_shm.name: bad");
        } else {
          response.set_registered_region_id(absl::StrCat("shm-", next++));
        }
      } else if (request.register_region().has_cuda_ipc()) {
        const v1::CudaIpcRegion& region = request.register_region().cuda_ipc();
        if (region.handle().size() != 64 || region.device_uuid().size() != 16) {
          response.set_code(grpc::StatusCode::INVALID_ARGUMENT);
          response.set_message("register_region.cuda_ipc.handle: 64 bytes expected");
        } else {
          response.set_registered_region_id(absl::StrCat("ipc-", next++));
        }
      } else {
        response.set_registered_region_id(absl::StrCat("event-", next++));
      }
      if (!response.registered_region_id().empty()) held[response.registered_region_id()] = true;
      stream->Write(response);
    }
    ended = true;
    (void)context;
    return grpc::Status::OK;
  }

  grpc::Status Compress(grpc::ServerContext* context, const v1::CompressRequest*,
                        v1::CompressResponse*) override {
    absl::MutexLock lock(&mu);
    client_ids.push_back(ClientIdOf(context));
    return grpc::Status::OK;
  }

  grpc::Status CompressSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream) override {
    {
      absl::MutexLock lock(&mu);
      client_ids.push_back(ClientIdOf(context));
    }
    v1::SessionRequest request;
    if (!stream->Read(&request) || !request.has_begin()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "begin: missing");
    }
    v1::LayerInput layer;
    std::string keys;
    bool pending = false;  // the current layer's chunked keys are incomplete
    auto answer = [&] {
      v1::SessionResponse response;
      response.mutable_layer()->set_layer_id(layer.layer_id());
      response.mutable_layer()->set_num_tokens(static_cast<int64_t>(keys.size()));
      stream->Write(response);
      pending = false;
    };
    int layers = 0;
    while (stream->Read(&request)) {
      messages += 1;
      if (request.has_tensor_chunk()) {
        const v1::TensorChunk& chunk = request.tensor_chunk();
        if (!pending || chunk.layer_id() != layer.layer_id() ||
            chunk.slot() != v1::TENSOR_SLOT_KEYS || chunk.offset_bytes() != keys.size()) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "tensor_chunk: out of order");
        }
        keys += chunk.data();
        if (keys.size() == layer.keys().chunked().total_bytes()) answer();
        continue;
      }
      if (pending) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "tensor_chunk: incomplete");
      }
      if (request.has_finish()) {
        v1::SessionResponse response;
        response.mutable_finished()->set_layers(layers);
        stream->Write(response);
        return grpc::Status::OK;
      }
      if (request.layer().layer_id() == 99) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "layer.layer_id: 99 is bad");
      }
      layer = request.layer();
      ++layers;
      if (layer.keys().has_chunked()) {
        keys.clear();
        pending = true;
      } else {
        keys = layer.keys().inline_data();
        answer();
      }
    }
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "finish: missing");
  }

  std::atomic<bool> refuse{false};
  std::atomic<bool> ended{false};
  std::atomic<int> messages{0};
  absl::Mutex mu;
  std::vector<std::string> client_ids ABSL_GUARDED_BY(mu);
};

class RegionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto client = Client::Connect(absl::StrCat("127.0.0.1:", port));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  void TearDown() override {
    client_.reset();
    server_->Shutdown();
  }

  /// Waits up to 5 s for the fake's Regions handler to see its stream end.
  bool WaitForStreamEnd() {
    for (int i = 0; i < 500 && !service_.ended; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return service_.ended;
  }

  /// A layer whose keys are `bytes` inline bytes.
  static v1::LayerInput Layer(int32_t id, size_t bytes) {
    v1::LayerInput layer;
    layer.set_layer_id(id);
    layer.mutable_keys()->set_dtype(v1::DTYPE_F32);
    layer.mutable_keys()->set_inline_data(std::string(bytes, 'k'));
    return layer;
  }

  FakeKvtrim service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(RegionsTest, OpenReadsTheLease) {
  absl::StatusOr<std::unique_ptr<RegionLease>> lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ((*lease)->client_id(), "client-7");
  EXPECT_EQ((*lease)->max_regions(), 4);
  EXPECT_TRUE((*lease)->Close().ok());
  EXPECT_TRUE(service_.ended);
}

TEST_F(RegionsTest, OpenReturnsTheStreamsStatus) {
  service_.refuse = true;
  absl::StatusOr<std::unique_ptr<RegionLease>> lease = client_->OpenRegionLease();
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lease.status().message(), "Regions: kvtrimd runs without --allow_client_shm");
}

TEST_F(RegionsTest, RegistersAndUnregisters) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<std::string> shm = (*lease)->RegisterHostShm("/seg", 4096);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ(*shm, "shm-0");
  absl::StatusOr<std::string> ipc =
      (*lease)->RegisterCudaIpc(std::string(64, 'h'), 0, std::string(16, 'u'), 1 << 20);
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  EXPECT_EQ(*ipc, "ipc-1");
  absl::StatusOr<std::string> event =
      (*lease)->RegisterCudaIpcEvent(std::string(64, 'e'), std::string(16, 'u'));
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(*event, "event-2");
  EXPECT_TRUE((*lease)->Unregister(*shm).ok());
  absl::Status again = (*lease)->Unregister(*shm);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(again.message(), "unregister_region.region_id: \"shm-0\"");
}

TEST_F(RegionsTest, AFailedRequestKeepsTheLease) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<std::string> bad = (*lease)->RegisterHostShm("/bad", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "register_region.host_shm.name: bad");
  absl::StatusOr<std::string> short_handle =
      (*lease)->RegisterCudaIpc("short", 0, std::string(16, 'u'), 1);
  EXPECT_EQ(short_handle.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> good = (*lease)->RegisterHostShm("/good", 1);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, "shm-0");
}

TEST_F(RegionsTest, AnswersOfOtherTagsAreSkipped) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<std::string> id = (*lease)->RegisterHostShm("/noise", 1);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "shm-0");
}

TEST_F(RegionsTest, AnEndedStreamFailsThisAndLaterRequests) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<std::string> id = (*lease)->RegisterHostShm("/die", 1);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(id.status().message(), "gone");
  EXPECT_EQ((*lease)->RegisterHostShm("/seg", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*lease)->Close().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(RegionsTest, RequestsAfterCloseFail) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE((*lease)->Close().ok());
  EXPECT_TRUE((*lease)->Close().ok());
  EXPECT_EQ((*lease)->Unregister("x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegionsTest, DestroyingTheLeaseEndsTheStream) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE((*lease)->RegisterHostShm("/seg", 1).ok());
  lease->reset();  // cancels: must not hang
  EXPECT_TRUE(WaitForStreamEnd());
}

TEST_F(RegionsTest, ConcurrentRequestsEachGetTheirOwnAnswer) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        absl::StatusOr<std::string> id = (*lease)->RegisterHostShm("/seg", 1);
        if (id.ok() && (*lease)->Unregister(*id).ok()) ++ok;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ok, 40);
}

TEST_F(RegionsTest, ClientIdTravelsAsMetadataOnceSet) {
  v1::CompressRequest request;
  ASSERT_TRUE(client_->Compress(request).ok());
  client_->SetClientId("client-7");
  EXPECT_EQ(client_->client_id(), "client-7");
  ASSERT_TRUE(client_->Compress(request).ok());
  auto session = client_->OpenSession(v1::CompressionSettings());
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->Finish().ok());
  client_->SetClientId("");
  ASSERT_TRUE(client_->Compress(request).ok());
  absl::MutexLock lock(&service_.mu);
  EXPECT_EQ(service_.client_ids, (std::vector<std::string>{"", "client-7", "client-7", ""}));
}

TEST(SessionChunkingTest, ChunkedLayersReachTheServerWhole) {
  FakeKvtrim service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.session_chunk_bytes = 100;
  auto client = Client::Connect(absl::StrCat("127.0.0.1:", port), options);
  ASSERT_TRUE(client.ok()) << client.status();
  {
    auto session = (*client)->OpenSession(v1::CompressionSettings());
    ASSERT_TRUE(session.ok()) << session.status();
    v1::LayerInput big;
    big.set_layer_id(0);
    big.mutable_keys()->set_inline_data(std::string(1050, 'k'));
    ASSERT_TRUE((*session)->SendLayer(big).ok());
    ASSERT_TRUE((*session)->WaitForAnswer(0).ok());
    v1::LayerInput small = big;
    small.set_layer_id(1);
    small.mutable_keys()->set_inline_data(std::string(60, 'k'));
    ASSERT_TRUE((*session)->SendLayer(small).ok());
    absl::StatusOr<SessionResult> result = (*session)->Finish();
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->layers.size(), 2u);
    EXPECT_EQ(result->layers[0].num_tokens(), 1050);
    EXPECT_EQ(result->layers[1].num_tokens(), 60);
    EXPECT_EQ(result->summary.layers(), 2);
    // big: 1 layer + 11 chunks; small: 1 layer; finish: 1.
    EXPECT_EQ(service.messages, 14);
  }
  client->reset();
  server->Shutdown();
}

TEST(SessionChunkingTest, WaitForAnswerReturnsTheStreamsError) {
  FakeKvtrim service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto client = Client::Connect(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(client.ok()) << client.status();
  {
    auto session = (*client)->OpenSession(v1::CompressionSettings());
    ASSERT_TRUE(session.ok()) << session.status();
    v1::LayerInput layer;
    layer.set_layer_id(99);
    layer.mutable_keys()->set_inline_data("kk");
    absl::Status sent = (*session)->SendLayer(layer);
    absl::Status waited = sent.ok() ? (*session)->WaitForAnswer(99) : sent;
    EXPECT_EQ(waited.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(waited.message(), "layer.layer_id: 99 is bad");
  }
  client->reset();
  server->Shutdown();
}

/// A fake server on a free port and a client of it with `chunk_bytes`.
struct FakeServerAndClient {
  explicit FakeServerAndClient(int64_t chunk_bytes) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    ClientOptions options;
    options.session_chunk_bytes = chunk_bytes;
    auto connected = Client::Connect(absl::StrCat("127.0.0.1:", port), options);
    if (connected.ok()) client = *std::move(connected);
  }
  ~FakeServerAndClient() {
    client.reset();
    if (server != nullptr) server->Shutdown();
  }
  FakeKvtrim service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<Client> client;
};

TEST(SessionChunkingTest, BytesFromTheCallersMemoryReachTheServerWhole) {
  FakeServerAndClient fake(100);
  ASSERT_NE(fake.client, nullptr);
  auto session = fake.client->OpenSession(v1::CompressionSettings());
  ASSERT_TRUE(session.ok()) << session.status();
  std::string keys(1050, 'k');
  v1::LayerInput layer;
  layer.set_layer_id(0);
  layer.mutable_keys();  // shape and dtype would go here
  LayerTensorBytes bytes;
  bytes.keys = absl::MakeConstSpan(keys);
  ASSERT_TRUE((*session)->SendLayer(layer, bytes).ok());
  keys.assign(keys.size(), 'x');  // the memory is the caller's again once SendLayer returns
  ASSERT_TRUE((*session)->WaitForAnswer(0).ok());
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->layers.size(), 1u);
  EXPECT_EQ(result->layers[0].num_tokens(), 1050);
  EXPECT_EQ(fake.service.messages, 1 + 11 + 1);  // layer, 11 chunks of <= 100 bytes, finish
}

TEST(SessionChunkingTest, BytesForAMissingOrFilledTensorAreRefused) {
  FakeServerAndClient fake(100);
  ASSERT_NE(fake.client, nullptr);
  auto session = fake.client->OpenSession(v1::CompressionSettings());
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string data(10, 'v');
  v1::LayerInput layer;
  layer.mutable_keys()->set_inline_data("kk");
  LayerTensorBytes bytes;
  bytes.values = absl::MakeConstSpan(data);
  absl::Status sent = (*session)->SendLayer(layer, bytes);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sent.message().find("layer.values"), std::string::npos) << sent;
  bytes = LayerTensorBytes();
  bytes.keys = absl::MakeConstSpan(data);
  sent = (*session)->SendLayer(layer, bytes);
  EXPECT_EQ(sent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sent.message().find("layer.keys, which already names its data"), std::string::npos)
      << sent;
}

TEST(SessionChunkingTest, ARejectedLayerWithBorrowedBytesReturnsTheError) {
  // The server ends the call at the layer message while megabytes of its chunks are still
  // being written: SendLayer returns the server's error, it does not hang.
  FakeServerAndClient fake(int64_t{1} << 20);
  ASSERT_NE(fake.client, nullptr);
  auto session = fake.client->OpenSession(v1::CompressionSettings());
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string keys(size_t{48} << 20, 'k');
  v1::LayerInput layer;
  layer.set_layer_id(99);
  layer.mutable_keys();
  LayerTensorBytes bytes;
  bytes.keys = absl::MakeConstSpan(keys);
  absl::Status sent = (*session)->SendLayer(layer, bytes);
  absl::Status status = sent.ok() ? (*session)->Finish().status() : sent;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(), "layer.layer_id: 99 is bad");
}

}  // namespace
}  // namespace kvtrim
