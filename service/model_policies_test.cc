// Model-aware policies through kvtrimd: LaProx answered at `finish` (model-wide), unary and
// session agreement, sessions abandoned half way, and the bad inputs of issue 4.
#include "tests/testing/random_model_test_util.h"
#include "kvtrim/v1/packed_lists.h"
#include "service/model_test_util.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;
using Stream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>;

constexpr int kLayers = 3;

constexpr auto Begin = SessionBegin;
constexpr auto LayerMsg = SessionLayer;
constexpr auto FinishMsg = SessionFinish;

class ModelPoliciesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = StartServer(TestConfig()).release();
    stub_ = v1::Kvtrim::NewStub(Connect(*server_)).release();
    // The layout of test_util's MakeLayer: H_kv = 2, H_q = 4, d = 8; 3 layers; a snapkv
    // profile built for window 32 and query statistics.
    RandomModelOptions o = RandomModelLayout(kLayers, 4, 2, 8, 48, 17);
    o.query_stats = true;
    o.profile_metric = "snapkv";
    digest_ = new std::string(Register(RandomModelInput(o)));
    RandomModelOptions bare = RandomModelLayout(kLayers, 4, 2, 8, 48, 18);
    bare_digest_ = new std::string(Register(RandomModelInput(bare)));
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete server_;
    delete digest_;
    delete bare_digest_;
  }

  static std::string Register(const ModelInput& input) {
    return RegisterThrough(*stub_, input, 1000);
  }

  static v1::CompressRequest Request(const std::string& policy, const std::string& digest) {
    v1::CompressRequest r = MakeRequest(policy, kLayers);
    r.mutable_settings()->set_model_digest(digest);
    r.mutable_settings()->set_num_layers(kLayers);
    r.mutable_settings()->mutable_budget()->set_keep_fraction(0.75);
    return r;
  }

  /// Runs a whole session; returns the final status and every response.
  static grpc::Status Session(const v1::CompressRequest& request, bool finish,
                              std::vector<v1::SessionResponse>* responses) {
    return CallSession(*stub_, request, finish, responses);
  }

  static Server* server_;
  static v1::Kvtrim::Stub* stub_;
  static std::string* digest_;
  static std::string* bare_digest_;
};
Server* ModelPoliciesTest::server_ = nullptr;
v1::Kvtrim::Stub* ModelPoliciesTest::stub_ = nullptr;
std::string* ModelPoliciesTest::digest_ = nullptr;
std::string* ModelPoliciesTest::bare_digest_ = nullptr;

TEST_F(ModelPoliciesTest, EveryModelPolicyAnswersUnaryAndSessionAlike) {
  for (const char* policy : {"criticalkv", "criticalkv_adakv", "criticalkv+pyramid", "laprox",
                             "expected_attention", "lukv"}) {
    SCOPED_TRACE(policy);
    v1::CompressRequest request = Request(policy, *digest_);
    v1::CompressResponse unary;
    const grpc::Status st = CallCompress(*stub_, request, &unary);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(unary.layers_size(), kLayers);
    std::vector<v1::SessionResponse> responses;
    ASSERT_TRUE(Session(request, true, &responses).ok());
    ASSERT_EQ(responses.size(), static_cast<size_t>(kLayers + 1));
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(responses[l].has_layer());
      EXPECT_EQ(responses[l].layer().indices().size(), unary.layers(l).indices().size());
      for (int i = 0; i < unary.layers(l).indices_size(); ++i) {
        ASSERT_EQ(responses[l].layer().indices(i), unary.layers(l).indices(i));
      }
    }
  }
}

TEST_F(ModelPoliciesTest, LaProxIsDecidedOverAllLayersAndAnsweredAtFinish) {
  v1::CompressRequest request = Request("laprox", *digest_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub_->CompressSession(&context);
  ASSERT_TRUE(stream->Write(Begin(request.settings())));
  for (const auto& layer : request.layers()) ASSERT_TRUE(stream->Write(LayerMsg(layer)));
  ASSERT_TRUE(stream->Write(FinishMsg()));
  stream->WritesDone();
  std::vector<v1::SessionResponse> responses;
  v1::SessionResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), static_cast<size_t>(kLayers + 1));
  // Budget conservation across the model (P7): 0.75 * 64 = 48 per head on average.
  int64_t kept = 0;
  bool ragged = false;
  for (int l = 0; l < kLayers; ++l) {
    for (const auto& head : responses[l].layer().heads()) {
      kept += head.kept();
      ragged |= head.kept() != 48;
      EXPECT_FALSE(head.has_perturbation());
    }
  }
  EXPECT_EQ(kept, 48 * 2 * kLayers);
  EXPECT_TRUE(ragged) << "a model-wide top-K over random layers should not be uniform";
  EXPECT_EQ(responses.back().finished().tokens_kept(), kept);
}

TEST_F(ModelPoliciesTest, ModelWideSessionWithoutFinishAnswersNoLayer) {
  std::vector<v1::SessionResponse> responses;
  const grpc::Status st = Session(Request("laprox", *digest_), /*finish=*/false, &responses);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("without sending finish"), std::string::npos);
  ASSERT_EQ(responses.size(), 1u);  // no layer answers: the error message alone
  EXPECT_TRUE(responses[0].has_error());
}

TEST_F(ModelPoliciesTest, CancelledSessionsLeaveNoState) {
  for (int round = 0; round < 3; ++round) {
    grpc::ClientContext context;
    auto stream = stub_->CompressSession(&context);
    v1::CompressRequest request = Request("laprox", *digest_);
    ASSERT_TRUE(stream->Write(Begin(request.settings())));
    ASSERT_TRUE(stream->Write(LayerMsg(request.layers(0))));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), StatusCode::CANCELLED);
  }
  // A fresh session gives the same answer as unary (no stale scores were carried over).
  v1::CompressRequest request = Request("laprox", *digest_);
  v1::CompressResponse unary;
  ASSERT_TRUE(CallCompress(*stub_, request, &unary).ok());
  std::vector<v1::SessionResponse> responses;
  ASSERT_TRUE(Session(request, true, &responses).ok());
  ASSERT_EQ(responses.size(), static_cast<size_t>(kLayers + 1));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(responses[l].layer().indices_size(), unary.layers(l).indices_size());
  }
}

TEST_F(ModelPoliciesTest, ModelWideFinishAnswersPackedWhenAsked) {
  v1::CompressRequest request = Request("laprox", *digest_);
  std::vector<v1::SessionResponse> repeated, packed;
  ASSERT_TRUE(Session(request, true, &repeated).ok());
  request.mutable_settings()->set_answer_encoding(v1::ANSWER_ENCODING_PACKED);
  ASSERT_TRUE(Session(request, true, &packed).ok());
  ASSERT_EQ(packed.size(), static_cast<size_t>(kLayers + 1));
  ASSERT_EQ(repeated.size(), packed.size());
  for (int l = 0; l < kLayers; ++l) {
    const v1::LayerResult& p = packed[l].layer();
    const v1::LayerResult& r = repeated[l].layer();
    ASSERT_TRUE(p.has_packed()) << l;
    EXPECT_EQ(p.indices_size(), 0);
    const uint32_t width = p.packed().index_bytes();
    ASSERT_EQ(p.packed().indices().size(), static_cast<size_t>(r.indices_size()) * width);
    for (int i = 0; i < r.indices_size(); ++i) {
      EXPECT_EQ(v1::LoadLittleEndian(p.packed().indices().data() + width * i, width),
                static_cast<uint64_t>(r.indices(i)))
          << "layer " << l << " index " << i;
    }
  }
}

TEST_F(ModelPoliciesTest, BadInputsNameTheField) {
  struct Case {
    std::string policy, digest;
    StatusCode code;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"criticalkv", "", StatusCode::FAILED_PRECONDITION, "settings.model_digest: policy"},
      {"criticalkv", "sha256:0000", StatusCode::FAILED_PRECONDITION, "unknown model digest"},
      {"lukv", *bare_digest_, StatusCode::FAILED_PRECONDITION, "profile.snapkv"},
      {"expected_attention_model", *bare_digest_, StatusCode::FAILED_PRECONDITION,
       "query statistics"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.policy + " " + c.digest);
    v1::CompressRequest request = Request(c.policy == "expected_attention_model"
                                              ? "expected_attention"
                                              : c.policy,
                                          c.digest);
    if (c.policy == "expected_attention_model") {
      (*request.mutable_settings()->mutable_policy()->mutable_params())["query_stats"]
          .set_text("model");
    }
    const grpc::Status st = CallCompress(*stub_, request);
    EXPECT_EQ(st.error_code(), c.code) << st.error_message();
    EXPECT_NE(st.error_message().find(c.fragment), std::string::npos) << st.error_message();
  }
  // Profile built for another protection.
  v1::CompressRequest sink = Request("lukv", *digest_);
  sink.mutable_settings()->set_sink_tokens(4);
  grpc::Status st = CallCompress(*stub_, sink);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("sink_tokens/recent_tokens"), std::string::npos);
  // A layer that does not fit the model's head layout.
  LayerDims dims;
  dims.kv_heads = 1;
  v1::CompressRequest shape = Request("criticalkv", *digest_);
  *shape.mutable_layers(0) = MakeLayer(0, dims);
  st = CallCompress(*stub_, shape);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("layers[0].keys.shape"), std::string::npos)
      << st.error_message();
  // A layer id beyond the model.
  v1::CompressRequest deep = Request("laprox", *digest_);
  deep.mutable_layers(2)->set_layer_id(7);
  deep.mutable_settings()->set_num_layers(0);
  st = CallCompress(*stub_, deep);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("num_layers="), std::string::npos) << st.error_message();
  // laprox does not compose with another allocator or a shared list.
  st = CallCompress(*stub_, Request("laprox+adakv", *digest_));
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("settings.policy.name"), std::string::npos)
      << st.error_message();
  v1::CompressRequest shared = Request("laprox", *digest_);
  shared.mutable_settings()->set_output_shape(v1::SHARED);
  st = CallCompress(*stub_, shared);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("settings.output_shape"), std::string::npos);
  // BLOCK_ALIGNED without a block size.
  v1::CompressRequest blocks = MakeRequest("snapkv", 1);
  blocks.mutable_settings()->set_output_shape(v1::BLOCK_ALIGNED);
  st = CallCompress(*stub_, blocks);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("settings.block_size"), std::string::npos);
  blocks.mutable_settings()->set_block_size(16);
  v1::CompressResponse answer;
  ASSERT_TRUE(CallCompress(*stub_, blocks, &answer).ok());
  EXPECT_EQ(answer.layers(0).output_shape(), v1::BLOCK_ALIGNED);
  EXPECT_EQ(answer.layers(0).indices_size() % 16, 0);
}

}  // namespace
}  // namespace kvtrim::service::testing
