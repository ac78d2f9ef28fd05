// Every bad Compress input gets the exact status code and a message naming the field.
#include <cmath>
#include <limits>

#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;

class CompressErrorsTest : public SharedServerTest {
 protected:
  grpc::Status Call(const v1::CompressRequest& request) { return CallCompress(*stub_, request); }
};

TEST_F(CompressErrorsTest, ValidRequestSucceeds) {
  v1::CompressResponse response;
  ASSERT_TRUE(CallCompress(*stub_, MakeRequest("snapkv", 2), &response).ok());
  ASSERT_EQ(response.layers_size(), 2);
  EXPECT_EQ(response.backend(), "cpu");
  const auto& layer = response.layers(0);
  EXPECT_EQ(layer.num_tokens(), 64);
  ASSERT_EQ(layer.offsets_size(), 3);  // [H_kv + 1]
  ASSERT_EQ(layer.heads_size(), 2);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(layer.heads(h).kept(), 32);  // keep_fraction 0.5 of n = 64
    EXPECT_EQ(layer.offsets(h + 1) - layer.offsets(h), 32);
    for (int64_t i = layer.offsets(h) + 1; i < layer.offsets(h + 1); ++i) {
      EXPECT_LT(layer.indices(i - 1), layer.indices(i));  // ascending
    }
    EXPECT_TRUE(layer.heads(h).has_perturbation());
  }
}

TEST_F(CompressErrorsTest, WrongRank) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->clear_shape();
  r.mutable_layers(0)->mutable_keys()->add_shape(2);
  r.mutable_layers(0)->mutable_keys()->add_shape(512);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].keys.shape: expected rank 3 [H_kv, n, d], got rank 2");
}

TEST_F(CompressErrorsTest, ValuesHeadsMismatch) {
  auto r = MakeRequest("dropkv");
  *r.mutable_layers(0)->mutable_values() = MakeTensor(v1::DTYPE_F32, {1, 64, 8}, Values(512, 9));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].values.shape");
}

TEST_F(CompressErrorsTest, ValuesTokensMismatch) {
  auto r = MakeRequest("dropkv");
  *r.mutable_layers(0)->mutable_values() = MakeTensor(v1::DTYPE_F32, {2, 63, 8}, Values(1008, 9));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].values.shape");
}

TEST_F(CompressErrorsTest, QueriesHeadDimMismatch) {
  auto r = MakeRequest("snapkv");
  *r.mutable_layers(0)->mutable_queries() = MakeTensor(v1::DTYPE_F32, {4, 16, 4}, Values(256, 9));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].queries.shape[2]");
}

TEST_F(CompressErrorsTest, QueriesWindowLongerThanTokens) {
  LayerDims dims;
  dims.window = 65;  // w > n = 64
  EXPECT_GRPC_ERROR(Call(MakeRequest("h2o", 1, dims)), StatusCode::INVALID_ARGUMENT,
                    "layers[0].queries.shape[1]");
}

TEST_F(CompressErrorsTest, QueryHeadsNotMultipleOfKvHeads) {
  LayerDims dims;
  dims.query_heads = 3;  // H_q = 3, H_kv = 2
  EXPECT_GRPC_ERROR(Call(MakeRequest("snapkv", 1, dims)), StatusCode::INVALID_ARGUMENT,
                    "layers[0].queries.shape[0]: H_q=3 is not a positive multiple of H_kv=2");
}

TEST_F(CompressErrorsTest, ByteLengthDiffersFromShape) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->mutable_inline_data()->resize(100);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].keys.inline_data: 100 bytes, but shape [2, 64, 8]");
}

TEST_F(CompressErrorsTest, HalfDtypeWithFloatBytes) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->set_dtype(v1::DTYPE_BF16);  // f32 bytes: 2x too long
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].keys.inline_data");
}

TEST_F(CompressErrorsTest, UnspecifiedDtype) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].keys.dtype");
}

TEST_F(CompressErrorsTest, UnknownDtype) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->set_dtype(static_cast<v1::DType>(7));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].keys.dtype: unknown dtype 7");
}

TEST_F(CompressErrorsTest, ZeroTokens) {
  auto r = MakeRequest("knorm");
  auto* keys = r.mutable_layers(0)->mutable_keys();
  keys->set_shape(1, 0);
  keys->clear_inline_data();
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].keys.shape[1]: n must be >= 1, got 0");
}

TEST_F(CompressErrorsTest, KeepFractionZero) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->mutable_budget()->set_keep_fraction(0);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.budget.keep_fraction");
}

TEST_F(CompressErrorsTest, KeepFractionNegative) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->mutable_budget()->set_keep_fraction(-0.25);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.budget.keep_fraction: must be in (0, 1]");
}

TEST_F(CompressErrorsTest, KeepFractionAboveOne) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->mutable_budget()->set_keep_fraction(1.5);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.budget.keep_fraction");
}

TEST_F(CompressErrorsTest, KeepFractionNaN) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->mutable_budget()->set_keep_fraction(std::nan(""));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.budget.keep_fraction");
}

TEST_F(CompressErrorsTest, KeepTokensZero) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->mutable_budget()->set_keep_tokens(0);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.budget.keep_tokens");
}

TEST_F(CompressErrorsTest, KeepTokensAboveTokens) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->mutable_budget()->set_keep_tokens(65);  // n = 64
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "budget.keep_tokens=65 exceeds n=64");
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0]");
}

TEST_F(CompressErrorsTest, BudgetMissing) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->clear_budget();
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.budget: required");
}

TEST_F(CompressErrorsTest, SettingsMissing) {
  auto r = MakeRequest("knorm");
  r.clear_settings();
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings: required");
}

TEST_F(CompressErrorsTest, NegativeSinkAndRecent) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->set_sink_tokens(-1);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.sink_tokens: must be >= 0");
  r.mutable_settings()->clear_sink_tokens();
  r.mutable_settings()->set_recent_tokens(-4);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.recent_tokens: must be >= 0");
}

TEST_F(CompressErrorsTest, NaNInKeys) {
  auto r = MakeRequest("knorm");
  std::vector<float> keys = Values(2 * 64 * 8, 5);
  keys[1 * 64 * 8 + 3 * 8 + 2] = std::numeric_limits<float>::quiet_NaN();
  *r.mutable_layers(0)->mutable_keys() = MakeTensor(v1::DTYPE_F32, {2, 64, 8}, keys);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].keys: contains NaN at [1, 3, 2]");
}

TEST_F(CompressErrorsTest, InfInKeys) {
  auto r = MakeRequest("knorm");
  std::vector<float> keys = Values(2 * 64 * 8, 5);
  keys[7] = -std::numeric_limits<float>::infinity();
  *r.mutable_layers(0)->mutable_keys() = MakeTensor(v1::DTYPE_F32, {2, 64, 8}, keys);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].keys: contains Inf");
}

TEST_F(CompressErrorsTest, InfInBf16Keys) {
  LayerDims dims;
  dims.dtype = v1::DTYPE_BF16;
  auto r = MakeRequest("knorm", 1, dims);
  std::vector<float> keys = Values(2 * 64 * 8, 5);
  keys[100] = std::numeric_limits<float>::infinity();
  *r.mutable_layers(0)->mutable_keys() = MakeTensor(v1::DTYPE_BF16, {2, 64, 8}, keys);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].keys: contains Inf");
}

TEST_F(CompressErrorsTest, UnknownPolicy) {
  EXPECT_GRPC_ERROR(Call(MakeRequest("no_such_policy")), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.name: unknown policy 'no_such_policy'");
}

TEST_F(CompressErrorsTest, EmptyPolicyName) {
  EXPECT_GRPC_ERROR(Call(MakeRequest("")), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.name");
}

TEST_F(CompressErrorsTest, UnknownParameter) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["bogus"].set_number(1);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.bogus: unknown parameter");
}

TEST_F(CompressErrorsTest, ParameterOutOfRange) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["window"].set_number(0);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.window: 0 is out of range");
}

TEST_F(CompressErrorsTest, ParameterWithoutValue) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["window"];  // no oneof set
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.window: no value");
}

TEST_F(CompressErrorsTest, ParameterWrongKind) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["pooling"].set_number(3);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.policy.params.pooling");
}

TEST_F(CompressErrorsTest, DropKvWithoutQueries) {
  LayerDims dims;
  dims.queries = false;
  EXPECT_GRPC_ERROR(Call(MakeRequest("dropkv", 1, dims)), StatusCode::INVALID_ARGUMENT,
                    "layers[0].queries: policy 'dropkv' needs window queries");
}

TEST_F(CompressErrorsTest, DropKvWithoutValues) {
  LayerDims dims;
  dims.values = false;
  EXPECT_GRPC_ERROR(Call(MakeRequest("dropkv", 1, dims)), StatusCode::INVALID_ARGUMENT,
                    "layers[0].values: policy 'dropkv' needs values");
}

TEST_F(CompressErrorsTest, KeysMissing) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->clear_keys();
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].keys: required");
}

TEST_F(CompressErrorsTest, TensorWithoutData) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->clear_data();
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].keys.inline_data: no tensor data");
}

TEST_F(CompressErrorsTest, RegionTensorsAreOffWithoutAllowClientShm) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->mutable_keys()->mutable_host_shm()->set_region_id("r1");
  EXPECT_GRPC_ERROR(Call(r), StatusCode::FAILED_PRECONDITION,
                    "layers[0].keys.host_shm.region_id: regions: this kvtrimd runs without "
                    "--allow_client_shm");
  r.mutable_layers(0)->mutable_keys()->mutable_cuda_ipc()->set_region_id("r1");
  EXPECT_GRPC_ERROR(Call(r), StatusCode::FAILED_PRECONDITION, "layers[0].keys.cuda_ipc");
}

TEST_F(CompressErrorsTest, OutputShapeUnknownOrWithoutBlockSize) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->set_output_shape(v1::BLOCK_ALIGNED);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.block_size: BLOCK_ALIGNED");
  r.mutable_settings()->set_block_size(-3);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.block_size: must be >= 0");
  r.mutable_settings()->set_output_shape(static_cast<v1::OutputShape>(42));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.output_shape: unknown");
}

TEST_F(CompressErrorsTest, NegativeLayerId) {
  auto r = MakeRequest("knorm");
  r.mutable_layers(0)->set_layer_id(-1);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].layer_id: must be in [0, 1048575], got -1");
}

TEST_F(CompressErrorsTest, LayerIdNotBelowNumLayers) {
  auto r = MakeRequest("knorm", 2);
  r.mutable_settings()->set_num_layers(1);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[1].layer_id: 1 is not below num_layers=1");
}

TEST_F(CompressErrorsTest, NegativeNumLayers) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->set_num_layers(-2);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "settings.num_layers");
}

TEST_F(CompressErrorsTest, BadSoftmaxScale) {
  auto r = MakeRequest("snapkv");
  r.mutable_layers(0)->set_softmax_scale(std::numeric_limits<float>::infinity());
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[0].softmax_scale");
}

TEST_F(CompressErrorsTest, DuplicateLayerIds) {
  auto r = MakeRequest("knorm", 4);
  r.mutable_layers(3)->set_layer_id(2);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[3].layer_id: duplicate layer_id 2");
}

TEST_F(CompressErrorsTest, EmptyLayers) {
  auto r = MakeRequest("knorm", 0);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers: empty");
}

TEST_F(CompressErrorsTest, ModelDigestIsUnknown) {
  auto r = MakeRequest("knorm");
  r.mutable_settings()->set_model_digest("sha256:abc");
  EXPECT_GRPC_ERROR(Call(r), StatusCode::FAILED_PRECONDITION,
                    "settings.model_digest: unknown model digest 'sha256:abc'");
}

TEST_F(CompressErrorsTest, SecondLayerErrorNamesItsIndex) {
  auto r = MakeRequest("knorm", 3);
  r.mutable_layers(2)->mutable_keys()->mutable_inline_data()->resize(12);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT, "layers[2].keys.inline_data");
}

TEST_F(CompressErrorsTest, DeadlineAlreadyExpired) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  v1::CompressResponse response;
  const grpc::Status s = stub_->Compress(&context, MakeRequest("knorm"), &response);
  EXPECT_EQ(s.error_code(), StatusCode::DEADLINE_EXCEEDED) << s.error_message();
}

TEST_F(CompressErrorsTest, DeadlineExpiresBetweenLayers) {
  // Many large layers with a deadline far shorter than their compute: the server stops
  // between layers and the client sees DEADLINE_EXCEEDED.
  LayerDims dims;
  dims.tokens = 1024;
  dims.window = 64;
  dims.head_dim = 32;
  dims.kv_heads = 2;
  dims.query_heads = 8;  // 512 KiB of keys + values per layer, 12 MiB in all
  auto r = MakeRequest("dropkv", 24, dims);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(30));
  v1::CompressResponse response;
  const grpc::Status s = stub_->Compress(&context, r, &response);
  EXPECT_EQ(s.error_code(), StatusCode::DEADLINE_EXCEEDED) << s.error_message();
}

TEST_F(CompressErrorsTest, ListPoliciesDescribesPresetsAndParts) {
  grpc::ClientContext context;
  v1::ListPoliciesResponse response;
  ASSERT_TRUE(stub_->ListPolicies(&context, v1::ListPoliciesRequest(), &response).ok());
  bool dropkv = false;
  bool composed = false;
  for (const auto& p : response.policies()) {
    if (p.name() == "dropkv") {
      dropkv = true;
      EXPECT_EQ(p.scorer(), "dropkv");
      EXPECT_EQ(p.allocator(), "uniform");
      EXPECT_THAT(p.inputs(), ::testing::Contains(v1::POLICY_INPUT_QUERIES));
      EXPECT_THAT(p.inputs(), ::testing::Contains(v1::POLICY_INPUT_VALUES));
      EXPECT_FALSE(p.params().empty());
    }
    composed |= p.name() == "dropkv+adakv";
  }
  EXPECT_TRUE(dropkv);
  EXPECT_TRUE(composed);
  EXPECT_THAT(response.allocators(), ::testing::Contains("adakv"));
}

TEST_F(CompressErrorsTest, ComposedPolicyWorks) {
  v1::CompressResponse response;
  ASSERT_TRUE(CallCompress(*stub_, MakeRequest("dropkv+adakv", 2), &response).ok());
  ASSERT_EQ(response.layers_size(), 2);
  int64_t total = 0;
  for (const auto& h : response.layers(1).heads()) total += h.kept();
  EXPECT_EQ(total, 2 * 32);  // AdaKV conserves the layer total H_kv * k
}

TEST_F(CompressErrorsTest, SharedOutputShapeHasOneList) {
  auto r = MakeRequest("snapkv");
  r.mutable_settings()->set_output_shape(v1::SHARED);
  v1::CompressResponse response;
  ASSERT_TRUE(CallCompress(*stub_, r, &response).ok());
  const auto& layer = response.layers(0);
  EXPECT_EQ(layer.output_shape(), v1::SHARED);
  ASSERT_EQ(layer.offsets_size(), 2);
  EXPECT_EQ(layer.offsets(1), layer.indices_size());
  EXPECT_EQ(layer.heads_size(), 2);
}

TEST_F(CompressErrorsTest, EveryDtypeIsAccepted) {
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16}) {
    LayerDims dims;
    dims.dtype = dtype;
    v1::CompressResponse response;
    const grpc::Status s = CallCompress(*stub_, MakeRequest("snapkv", 1, dims), &response);
    EXPECT_TRUE(s.ok()) << v1::DType_Name(dtype) << ": " << s.error_message();
  }
}

/// A server whose gRPC receive limit is 1 MiB.
TEST(CompressLimitsTest, MessageOverTheLimitIsResourceExhausted) {
  Config config = TestConfig();
  config.max_message_bytes = 1 << 20;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  LayerDims dims;
  dims.tokens = 4096;
  dims.head_dim = 64;  // keys + values 2 x 2 MiB
  auto r = MakeRequest("knorm", 1, dims);
  ASSERT_GT(r.ByteSizeLong(), size_t{1} << 20);
  EXPECT_GRPC_ERROR(CallCompress(*stub, r), StatusCode::RESOURCE_EXHAUSTED, "");
  // A request under the limit on the same server still works.
  EXPECT_TRUE(CallCompress(*stub, MakeRequest("knorm")).ok());
}

/// Admission: with max_inflight = 1, an open session holds the only slot.
TEST(CompressLimitsTest, MaxInflightRejectsExtraCalls) {
  Config config = TestConfig();
  config.max_inflight = 1;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  grpc::ClientContext session_context;
  auto session = stub->CompressSession(&session_context);
  v1::SessionRequest begin;
  *begin.mutable_begin() = MakeSettings("knorm");
  ASSERT_TRUE(session->Write(begin));
  // Wait until the session is admitted on the server.
  for (int i = 0; i < 500 && server->service().inflight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(server->service().inflight(), 1);
  EXPECT_GRPC_ERROR(CallCompress(*stub, MakeRequest("knorm")), StatusCode::RESOURCE_EXHAUSTED,
                    "max_inflight");
  v1::SessionRequest finish;
  finish.mutable_finish();
  ASSERT_TRUE(session->Write(finish));
  session->WritesDone();
  v1::SessionResponse response;
  while (session->Read(&response)) {
  }
  EXPECT_TRUE(session->Finish().ok());
  // The slot is free again.
  for (int i = 0; i < 500 && server->service().inflight() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(CallCompress(*stub, MakeRequest("knorm")).ok());
}

/// Admission: a client that sends its next call as soon as it has an answer is never
/// refused by a limit it does not exceed (the slot is given back before the status goes
/// out, not when gRPC later destroys the call).
TEST(CompressLimitsTest, SequentialCallsNeverHitMaxInflight) {
  Config config = TestConfig();
  config.max_inflight = 1;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  const v1::CompressRequest request = MakeRequest("knorm");
  for (int i = 0; i < 400; ++i) {
    const grpc::Status status = CallCompress(*stub, request);
    ASSERT_TRUE(status.ok()) << "call " << i << ": " << status.error_message();
  }
  for (int i = 0; i < 100; ++i) {
    std::vector<v1::SessionResponse> responses;
    const grpc::Status status = CallSession(*stub, request, /*finish=*/true, &responses);
    ASSERT_TRUE(status.ok()) << "session " << i << ": " << status.error_message();
  }
}

}  // namespace
}  // namespace kvtrim::service::testing
