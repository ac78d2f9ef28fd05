// Output regions on the CPU backend: a layer's kept lists written into the caller's
// host_shm region (Compress and CompressSession, every output shape) equal the repeated
// fields of the ordinary answer; misuse gets errors naming `output`. (cuda_ipc output
// regions: tests/integration/ipc_transport_test.cc on a GPU.)
#include <cstring>
#include <vector>

#include "service/transport_test_util.h"

namespace kvtrim::service::testing {
namespace {

constexpr int kLayers = 3;
constexpr uint64_t kSlotBytes = 64 << 10;  // per layer: 8 (L + 1) + 4 L n fits easily

/// A server with regions allowed, one lease and one registered 1 MiB segment.
class OutputRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config = TestConfig();
    config.allow_client_shm = true;
    server_ = StartServer(config);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Kvtrim::NewStub(Connect(*server_));
    lease_ = std::make_unique<TestLease>(*stub_);
    ASSERT_FALSE(lease_->client_id().empty());
    const v1::RegionResponse registered = lease_->RegisterShm(segment_.name(), segment_.size());
    ASSERT_EQ(registered.code(), 0) << registered.message();
    region_ = registered.registered_region_id();
  }

  /// Settings of `policy` with `shape`.
  static v1::CompressionSettings Settings(const std::string& policy, v1::OutputShape shape) {
    v1::CompressionSettings settings = MakeSettings(policy, 0.3);
    settings.set_output_shape(shape);
    if (shape == v1::BLOCK_ALIGNED) settings.set_block_size(8);
    return settings;
  }

  /// Points layer `layer`'s output at its slot of the segment.
  void AimOutput(v1::LayerInput* layer) const {
    v1::RegionSlice* slice = layer->mutable_output()->mutable_host_shm();
    slice->set_region_id(region_);
    slice->set_offset_bytes(static_cast<uint64_t>(layer->layer_id()) * kSlotBytes);
  }

  /// Checks that the slot of `expected.layer_id()` holds its lists, and that `answer`
  /// says so and carries none itself.
  void ExpectWritten(const v1::LayerResult& expected, const v1::LayerResult& answer) {
    SCOPED_TRACE("layer " + std::to_string(expected.layer_id()));
    EXPECT_TRUE(answer.output_written());
    EXPECT_EQ(answer.offsets_size(), 0);
    EXPECT_EQ(answer.indices_size(), 0);
    EXPECT_FALSE(answer.has_packed());
    ASSERT_EQ(answer.heads_size(), expected.heads_size());
    for (int h = 0; h < expected.heads_size(); ++h) {
      EXPECT_EQ(answer.heads(h).kept(), expected.heads(h).kept());
    }
    const char* slot = segment_.data() + static_cast<uint64_t>(expected.layer_id()) * kSlotBytes;
    std::vector<int64_t> offsets(static_cast<size_t>(expected.offsets_size()));
    std::memcpy(offsets.data(), slot, offsets.size() * sizeof(int64_t));
    EXPECT_EQ(offsets, std::vector<int64_t>(expected.offsets().begin(), expected.offsets().end()));
    std::vector<int32_t> indices(static_cast<size_t>(expected.indices_size()));
    std::memcpy(indices.data(), slot + offsets.size() * sizeof(int64_t),
                indices.size() * sizeof(int32_t));
    EXPECT_EQ(indices, std::vector<int32_t>(expected.indices().begin(), expected.indices().end()));
  }

  TestSegment segment_{1 << 20};
  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Kvtrim::Stub> stub_;
  std::unique_ptr<TestLease> lease_;
  std::string region_;
};

const v1::OutputShape kShapes[] = {v1::PER_HEAD, v1::SHARED, v1::BLOCK_ALIGNED, v1::EQUAL_COUNT};

TEST_F(OutputRegionTest, CompressWritesTheListsOfEveryOutputShape) {
  for (const std::string policy : {"snapkv", "dropkv", "knorm"}) {
    for (v1::OutputShape shape : kShapes) {
      SCOPED_TRACE(policy + " " + v1::OutputShape_Name(shape));
      v1::CompressRequest request = MakeRequest(policy, kLayers);
      *request.mutable_settings() = Settings(policy, shape);
      v1::CompressResponse expected;
      ASSERT_TRUE(CallCompress(*stub_, request, &expected).ok());
      std::memset(segment_.data(), 0xAB, segment_.size());
      for (auto& layer : *request.mutable_layers()) AimOutput(&layer);
      v1::CompressResponse answer;
      const grpc::Status status = CompressAs(*stub_, lease_->client_id(), request, &answer);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_EQ(answer.layers_size(), kLayers);
      for (int i = 0; i < kLayers; ++i) ExpectWritten(expected.layers(i), answer.layers(i));
    }
  }
}

TEST_F(OutputRegionTest, SessionWritesTheListsOfEveryOutputShape) {
  for (v1::OutputShape shape : kShapes) {
    SCOPED_TRACE(v1::OutputShape_Name(shape));
    v1::CompressRequest request = MakeRequest("dropkv", kLayers);
    *request.mutable_settings() = Settings("dropkv", shape);
    v1::CompressResponse expected;
    ASSERT_TRUE(CallCompress(*stub_, request, &expected).ok());
    std::memset(segment_.data(), 0xAB, segment_.size());
    std::vector<v1::SessionRequest> messages;
    for (auto layer : request.layers()) {
      AimOutput(&layer);
      messages.push_back(SessionLayer(layer));
    }
    messages.push_back(SessionFinish());
    std::vector<v1::LayerResult> answers;
    const grpc::Status status =
        RunSession(*stub_, lease_->client_id(), request.settings(), messages, &answers);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(answers.size(), static_cast<size_t>(kLayers));
    for (int i = 0; i < kLayers; ++i) ExpectWritten(expected.layers(i), answers[i]);
  }
}

TEST_F(OutputRegionTest, MisuseNamesTheOutputField) {
  v1::CompressRequest request = MakeRequest("snapkv");
  v1::CompressResponse response;
  auto with = [&](auto edit) {
    v1::CompressRequest r = request;
    AimOutput(r.mutable_layers(0));
    edit(r.mutable_layers(0)->mutable_output());
    return CompressAs(*stub_, lease_->client_id(), r, &response);
  };
  EXPECT_GRPC_ERROR(with([](v1::OutputRegion* o) { o->mutable_host_shm()->set_offset_bytes(4); }),
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "layers[0].output.host_shm.offset_bytes: 4 is not a multiple of 8");
  EXPECT_GRPC_ERROR(
      with([&](v1::OutputRegion* o) {
        o->mutable_host_shm()->set_offset_bytes(segment_.size() - 64);
      }),
      grpc::StatusCode::INVALID_ARGUMENT, "layers[0].output: the region holds 64 bytes");
  EXPECT_GRPC_ERROR(
      with([&](v1::OutputRegion* o) {
        o->mutable_host_shm()->set_offset_bytes(segment_.size());
      }),
      grpc::StatusCode::INVALID_ARGUMENT, "layers[0].output.host_shm.offset_bytes");
  EXPECT_GRPC_ERROR(with([](v1::OutputRegion* o) { o->set_done_event_id("evt-1"); }),
                    grpc::StatusCode::INVALID_ARGUMENT, "layers[0].output.done_event_id");
  EXPECT_GRPC_ERROR(with([](v1::OutputRegion* o) { o->mutable_host_shm()->add_strides_elements(1); }),
                    grpc::StatusCode::INVALID_ARGUMENT, "layers[0].output.host_shm: an output "
                    "region is dense");
  EXPECT_GRPC_ERROR(with([](v1::OutputRegion* o) { o->mutable_host_shm()->set_region_id("shm-0"); }),
                    grpc::StatusCode::NOT_FOUND, "layers[0].output.host_shm.region_id");
  EXPECT_GRPC_ERROR(with([](v1::OutputRegion* o) { o->clear_target(); }),
                    grpc::StatusCode::INVALID_ARGUMENT, "layers[0].output: set host_shm or cuda_ipc");
  // The server keeps serving, and the same region works once the request is right.
  v1::CompressRequest good = request;
  AimOutput(good.mutable_layers(0));
  EXPECT_TRUE(CompressAs(*stub_, lease_->client_id(), good, &response).ok());
  EXPECT_TRUE(response.layers(0).output_written());
}

}  // namespace
}  // namespace kvtrim::service::testing
