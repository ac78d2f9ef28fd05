// RegisterModel / ListModels / DeleteModel through an in-process kvtrimd, persistence
// across a server restart on the same data_dir, and compression settings naming a digest.
#include <stdlib.h>

#include <filesystem>

#include "service/model_digest.h"
#include "service/model_test_util.h"
#include "service/test_util.h"
#include "tests/testing/test_dir.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;

/// Streams `messages` as one RegisterModel call.
grpc::Status Register(v1::Kvtrim::Stub& stub, const std::vector<v1::RegisterModelRequest>& messages,
                      std::string* digest = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::RegisterModelResponse response;
  auto writer = stub.RegisterModel(&context, &response);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (digest != nullptr) *digest = response.digest();
  return status;
}

grpc::Status List(v1::Kvtrim::Stub& stub, v1::ListModelsResponse* response) {
  grpc::ClientContext context;
  return stub.ListModels(&context, v1::ListModelsRequest(), response);
}

grpc::Status Delete(v1::Kvtrim::Stub& stub, const std::string& digest) {
  grpc::ClientContext context;
  v1::DeleteModelRequest request;
  request.set_digest(digest);
  v1::DeleteModelResponse response;
  return stub.DeleteModel(&context, request, &response);
}

ModelInput TestModel(uint64_t seed = 5) {
  ModelInput input = MakeTestModelInput(2, 4, 2, 8, 32, seed, /*with_query_stats=*/true);
  AddTestProfile(&input, "snapkv", "snapkv", 4, 32, seed);
  return input;
}

class ModelRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = kvtrim::testing::MakeTestSubdir("models");
    Start();
  }
  void TearDown() override {
    stub_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Start(int max_models = 16) {
    Config config = TestConfig();
    config.data_dir = dir_;
    config.max_models = max_models;
    config.max_message_bytes = 64 << 10;  // the stream stays below it with 4 KiB chunks
    server_ = StartServer(config);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Kvtrim::NewStub(Connect(*server_));
  }
  void Restart(int max_models = 16) {
    stub_.reset();
    server_.reset();
    Start(max_models);
  }

  std::string dir_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Kvtrim::Stub> stub_;
};

TEST_F(ModelRpcTest, RegisterListDelete) {
  const ModelInput input = TestModel();
  std::string digest;
  ASSERT_TRUE(Register(*stub_, ToStream(input, 4096), &digest).ok());
  EXPECT_EQ(digest, ComputeModelDigest(input));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/" + DigestHex(digest) + ".kvtmodel"));

  // Same content in other chunks: the same digest, still one model.
  std::string again;
  ASSERT_TRUE(Register(*stub_, ToStream(input, 777, /*interleave=*/true), &again).ok());
  EXPECT_EQ(again, digest);

  v1::ListModelsResponse listed;
  ASSERT_TRUE(List(*stub_, &listed).ok());
  ASSERT_EQ(listed.models_size(), 1);
  EXPECT_EQ(listed.models(0).digest(), digest);
  EXPECT_EQ(listed.models(0).header().name(), "test-model");
  EXPECT_EQ(listed.models(0).header().num_layers(), 2);
  EXPECT_EQ(listed.models(0).weights_size(), 7);

  ASSERT_TRUE(Delete(*stub_, digest).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + DigestHex(digest) + ".kvtmodel"));
  listed.Clear();
  ASSERT_TRUE(List(*stub_, &listed).ok());
  EXPECT_EQ(listed.models_size(), 0);
  EXPECT_GRPC_ERROR(Delete(*stub_, digest), StatusCode::NOT_FOUND, "digest: no model");
  EXPECT_GRPC_ERROR(Delete(*stub_, "md5:1"), StatusCode::INVALID_ARGUMENT, "digest: 'md5:1'");

  EXPECT_EQ(CounterValue(*server_, "kvtrim_requests_total",
                         {{"rpc", "RegisterModel"}, {"code", "OK"}}),
            2);
  EXPECT_EQ(CounterValue(*server_, "kvtrim_requests_total",
                         {{"rpc", "DeleteModel"}, {"code", "NOT_FOUND"}}),
            1);
  EXPECT_GT(CounterValue(*server_, "kvtrim_request_bytes_total", {{"rpc", "RegisterModel"}}), 0);
}

TEST_F(ModelRpcTest, RegistrationErrorsNameTheField) {
  const auto stream = ToStream(TestModel(), 4096);
  EXPECT_GRPC_ERROR(Register(*stub_, {}), StatusCode::INVALID_ARGUMENT, "header: missing");
  EXPECT_GRPC_ERROR(Register(*stub_, {stream.begin() + 1, stream.end()}),
                    StatusCode::INVALID_ARGUMENT, "header: missing");
  auto wrong = stream;
  for (auto& m : wrong) {
    if (m.has_weight() && m.weight().name() == "layers.0.w_o" && m.weight().shape_size() == 2) {
      m.mutable_weight()->set_shape(0, 16);
      m.mutable_weight()->set_shape(1, 64);
    }
  }
  EXPECT_GRPC_ERROR(Register(*stub_, wrong), StatusCode::INVALID_ARGUMENT,
                    "weights[layers.0.w_o].shape: expected [32, 32], got [16, 64]");
  auto overlap = stream;
  overlap.insert(overlap.begin() + 2, overlap[1]);
  EXPECT_GRPC_ERROR(Register(*stub_, overlap), StatusCode::INVALID_ARGUMENT,
                    "offset_bytes: 0 overlaps bytes already received");
  // One message above --max_message_bytes is gRPC's own RESOURCE_EXHAUSTED.
  auto oversize = std::vector<v1::RegisterModelRequest>(stream.begin(), stream.begin() + 2);
  oversize[1].mutable_weight()->mutable_data()->resize(100 << 10);
  EXPECT_EQ(Register(*stub_, oversize).error_code(), StatusCode::RESOURCE_EXHAUSTED);
  v1::ListModelsResponse listed;
  ASSERT_TRUE(List(*stub_, &listed).ok());
  EXPECT_EQ(listed.models_size(), 0);
}

TEST_F(ModelRpcTest, ModelsSurviveARestart) {
  std::string a, b;
  ASSERT_TRUE(Register(*stub_, ToStream(TestModel(1), 4096), &a).ok());
  ASSERT_TRUE(Register(*stub_, ToStream(TestModel(2), 4096), &b).ok());
  Restart();
  v1::ListModelsResponse listed;
  ASSERT_TRUE(List(*stub_, &listed).ok());
  ASSERT_EQ(listed.models_size(), 2);
  std::set<std::string> digests = {listed.models(0).digest(), listed.models(1).digest()};
  EXPECT_EQ(digests, (std::set<std::string>{a, b}));
  EXPECT_NE(server_->models().Find(a), nullptr);
}

TEST_F(ModelRpcTest, MaxModels) {
  Restart(/*max_models=*/1);
  ASSERT_TRUE(Register(*stub_, ToStream(TestModel(1), 4096)).ok());
  EXPECT_GRPC_ERROR(Register(*stub_, ToStream(TestModel(2), 4096)), StatusCode::RESOURCE_EXHAUSTED,
                    "--max_models");
}

TEST_F(ModelRpcTest, CompressNamingADigest) {
  std::string digest;
  ASSERT_TRUE(Register(*stub_, ToStream(TestModel(), 4096), &digest).ok());
  LayerDims dims;  // H_kv=2, H_q=4, d=8: the test model's layout
  auto request = MakeRequest("knorm", 2, dims);
  request.mutable_settings()->set_model_digest(digest);
  v1::CompressResponse response;
  grpc::Status status = CallCompress(*stub_, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.layers_size(), 2);
  // Both layers are counted under the model's bounded label ("sha256:" + 12 hex digits).
  EXPECT_EQ(ModelLabel(digest).size(), 19u);
  EXPECT_EQ(CounterValue(*server_, "kvtrim_model_layers_total", {{"model", ModelLabel(digest)}}),
            2);

  request.mutable_settings()->set_model_digest("sha256:" + std::string(64, '0'));
  EXPECT_GRPC_ERROR(CallCompress(*stub_, request), StatusCode::FAILED_PRECONDITION,
                    "settings.model_digest: unknown model digest");
  ASSERT_TRUE(Delete(*stub_, digest).ok());
  request.mutable_settings()->set_model_digest(digest);
  EXPECT_GRPC_ERROR(CallCompress(*stub_, request), StatusCode::FAILED_PRECONDITION,
                    "unknown model digest");
}

TEST_F(ModelRpcTest, ExpiredDeadline) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  v1::RegisterModelResponse response;
  auto writer = stub_->RegisterModel(&context, &response);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), StatusCode::DEADLINE_EXCEEDED);
}

TEST(ModelRpcMemoryTest, InMemoryWhenNoDataDir) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  std::string digest;
  ASSERT_TRUE(Register(*stub, ToStream(TestModel(), 4096), &digest).ok());
  EXPECT_NE(server->models().Find(digest), nullptr);
  EXPECT_EQ(server->models().PathFor(digest), "");
}

}  // namespace
}  // namespace kvtrim::service::testing
