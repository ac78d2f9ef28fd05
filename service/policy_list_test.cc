// ListPolicies against the real service: every listed policy serves a valid request in every
// output shape it lists (compositions that can never run are neither listed nor accepted),
// and the numerics fields: the modes each policy lists, the mode each answer reports.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"
#include "service/model_test_util.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;

constexpr int kLayers = 3;  // the registered model's L; MakeLayer's H_kv = 2, H_q = 4, d = 8

/// The layers of every request: MakeLayer's [2, 64, 8] keys and values, [4, 32, 8] queries.
constexpr int64_t kTokens = 64;

class PolicyListTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = StartServer(TestConfig()).release();
    stub_ = v1::Kvtrim::NewStub(Connect(*server_)).release();
    digest_ = new std::string(RegisterThrough(*stub_, ModelWithEveryProfile(), 4096));
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete server_;
    delete digest_;
  }

  /// A random model of MakeLayer's layout with query statistics and, for every scorer, an
  /// LU-KV profile built for the scorer's default protection (what lukv compositions check).
  static ModelInput ModelWithEveryProfile() {
    RandomModelOptions options = RandomModelLayout(kLayers, 4, 2, 8, 48, 23);
    options.query_stats = true;
    options.profile_metric = "snapkv";
    ModelInput input = RandomModelInput(options);
    const ProfileInput curves = input.profiles.at("snapkv");
    PolicyRegistry registry;
    RegisterBuiltinPolicies(&registry);
    for (const ScorerSpec* scorer : registry.scorers()) {
      auto params = ResolvedParams::Resolve(scorer->params, {}, "params");
      EXPECT_TRUE(params.ok()) << params.status();
      const Protection protection = scorer->default_protection(*params, 0);
      ProfileInput profile = curves;
      profile.metric = scorer->name;
      profile.sink = protection.sink;
      profile.window = protection.recent;
      input.profiles[scorer->name] = std::move(profile);
    }
    return input;
  }

  static v1::ListPoliciesResponse List() {
    grpc::ClientContext context;
    v1::ListPoliciesResponse list;
    const grpc::Status st = stub_->ListPolicies(&context, v1::ListPoliciesRequest(), &list);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return list;
  }

  /// A valid request for `policy` in `shape`: kLayers layers with keys, values and queries,
  /// the registered model when the policy reads one, 3/4 of the tokens kept.
  static v1::CompressRequest RequestFor(const v1::PolicyInfo& policy, v1::OutputShape shape) {
    v1::CompressRequest request = MakeRequest(policy.name(), kLayers);
    v1::CompressionSettings& settings = *request.mutable_settings();
    settings.mutable_budget()->set_keep_fraction(0.75);
    settings.set_num_layers(kLayers);
    settings.set_output_shape(shape);
    if (shape == v1::BLOCK_ALIGNED) settings.set_block_size(16);
    for (int input : policy.inputs()) {
      if (input == v1::POLICY_INPUT_MODEL || input == v1::POLICY_INPUT_PROFILE) {
        settings.set_model_digest(*digest_);
      }
    }
    return request;
  }

  /// Runs `request` as one session; returns its status and the layer answers.
  static grpc::Status Session(const v1::CompressRequest& request,
                              std::vector<v1::LayerResult>* layers) {
    std::vector<v1::SessionResponse> responses;
    const grpc::Status st = CallSession(*stub_, request, /*finish=*/true, &responses);
    for (const v1::SessionResponse& response : responses) {
      if (response.has_layer()) layers->push_back(response.layer());
    }
    return st;
  }

  static Server* server_;
  static v1::Kvtrim::Stub* stub_;
  static std::string* digest_;
};
Server* PolicyListTest::server_ = nullptr;
v1::Kvtrim::Stub* PolicyListTest::stub_ = nullptr;
std::string* PolicyListTest::digest_ = nullptr;

TEST_F(PolicyListTest, EveryListedPolicyServesAValidRequestInEveryListedShape) {
  const v1::ListPoliciesResponse list = List();
  ASSERT_GT(list.policies_size(), 0);
  for (const v1::PolicyInfo& policy : list.policies()) {
    ASSERT_GT(policy.output_shapes_size(), 0) << policy.name();
    EXPECT_EQ(policy.output_shapes(0), v1::PER_HEAD) << policy.name();
    for (int shape_value : policy.output_shapes()) {
      const auto shape = static_cast<v1::OutputShape>(shape_value);
      SCOPED_TRACE(policy.name() + " " + v1::OutputShape_Name(shape));
      v1::CompressResponse response;
      const grpc::Status st = CallCompress(*stub_, RequestFor(policy, shape), &response);
      ASSERT_TRUE(st.ok()) << "code " << st.error_code() << ": " << st.error_message();
      ASSERT_EQ(response.layers_size(), kLayers);
      for (const v1::LayerResult& layer : response.layers()) {
        EXPECT_EQ(layer.output_shape(), shape);
        EXPECT_EQ(layer.num_tokens(), kTokens);
        // The server default (fast) where the policy lists it, exact otherwise.
        EXPECT_EQ(layer.numerics(), policy.numerics_modes(0));
        EXPECT_GT(layer.indices_size(), 0);
      }
    }
    // And once as a session (model-wide policies answer at finish).
    SCOPED_TRACE(policy.name() + " session");
    std::vector<v1::LayerResult> layers;
    const grpc::Status st = Session(RequestFor(policy, v1::PER_HEAD), &layers);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(layers.size(), static_cast<size_t>(kLayers));
  }
  // Presets plus the composable pairs: 11 scorers x 4 allocators less laprox's three.
  EXPECT_EQ(list.scorers_size() * list.allocators_size() - 3,
            static_cast<int>(std::count_if(list.policies().begin(), list.policies().end(),
                                           [](const v1::PolicyInfo& p) {
                                             return p.name().find('+') != std::string::npos;
                                           })));
}

TEST_F(PolicyListTest, CompositionsThatCannotRunAreNeitherListedNorAccepted) {
  const v1::ListPoliciesResponse list = List();
  std::set<std::string> names;
  for (const v1::PolicyInfo& policy : list.policies()) names.insert(policy.name());
  for (const std::string allocator : {"pyramid", "adakv", "lukv"}) {
    const std::string name = "laprox+" + allocator;
    SCOPED_TRACE(name);
    EXPECT_EQ(names.count(name), 0u);
    v1::CompressRequest request = MakeRequest(name, kLayers);
    request.mutable_settings()->set_model_digest(*digest_);
    EXPECT_GRPC_ERROR(CallCompress(*stub_, request), StatusCode::INVALID_ARGUMENT,
                      "settings.policy.name: policy '" + name +
                          "' cannot be served: laprox allocates by its own top-K");
    std::vector<v1::LayerResult> layers;
    EXPECT_GRPC_ERROR(Session(request, &layers), StatusCode::INVALID_ARGUMENT,
                      "begin.policy.name: policy '" + name + "' cannot be served");
    EXPECT_TRUE(layers.empty());
  }
  EXPECT_EQ(names.count("laprox+uniform"), 1u);
  // A shape the policy does not list is refused naming the field, before any model lookup.
  v1::CompressRequest shared = MakeRequest("laprox", kLayers);
  shared.mutable_settings()->set_output_shape(v1::SHARED);
  EXPECT_GRPC_ERROR(CallCompress(*stub_, shared), StatusCode::INVALID_ARGUMENT,
                    "settings.output_shape: policy 'laprox' answers PER_HEAD or EQUAL_COUNT "
                    "lists, not SHARED");
}

TEST_F(PolicyListTest, CpuBackendListsFastThenExactForEveryPolicy) {
  const v1::ListPoliciesResponse list = List();
  ASSERT_GT(list.policies_size(), 0);
  for (const v1::PolicyInfo& policy : list.policies()) {
    EXPECT_EQ(std::vector<int>(policy.numerics_modes().begin(), policy.numerics_modes().end()),
              CpuNumericsModes(policy.scorer()))
        << policy.name();
  }
}

TEST_F(PolicyListTest, TheCpuComputesFastWhereItCanAndSaysWhichItComputed) {
  for (const v1::Numerics asked : {v1::NUMERICS_FAST, v1::NUMERICS_UNSPECIFIED,
                                   v1::NUMERICS_EXACT}) {
    SCOPED_TRACE(v1::Numerics_Name(asked));
    v1::CompressRequest request = MakeRequest("snapkv", 2);
    request.mutable_settings()->set_numerics(asked);
    v1::CompressResponse response;
    ASSERT_TRUE(CallCompress(*stub_, request, &response).ok());
    ASSERT_EQ(response.layers_size(), 2);
    for (const v1::LayerResult& layer : response.layers()) {
      // Unspecified: the server's default, fast.
      EXPECT_EQ(layer.numerics(),
                asked == v1::NUMERICS_EXACT ? v1::NUMERICS_EXACT : v1::NUMERICS_FAST);
    }
  }
  // The model-aware policies in sessions, per-layer and model-wide (laprox answers at finish
  // from buffered scores): computed and reported in the mode asked.
  for (const char* policy : {"criticalkv", "laprox", "expected_attention"}) {
    for (const v1::Numerics asked : {v1::NUMERICS_FAST, v1::NUMERICS_EXACT}) {
      SCOPED_TRACE(absl::StrCat(policy, " ", v1::Numerics_Name(asked)));
      v1::CompressRequest request = MakeRequest(policy, kLayers);
      request.mutable_settings()->set_numerics(asked);
      request.mutable_settings()->set_model_digest(*digest_);
      request.mutable_settings()->set_num_layers(kLayers);
      std::vector<v1::LayerResult> layers;
      ASSERT_TRUE(Session(request, &layers).ok());
      ASSERT_EQ(layers.size(), static_cast<size_t>(kLayers));
      for (const v1::LayerResult& layer : layers) EXPECT_EQ(layer.numerics(), asked);
    }
  }
  // A mode outside the enum is refused naming the field.
  v1::CompressRequest bad = MakeRequest("snapkv");
  bad.mutable_settings()->set_numerics(static_cast<v1::Numerics>(9));
  EXPECT_GRPC_ERROR(CallCompress(*stub_, bad), StatusCode::INVALID_ARGUMENT,
                    "settings.numerics: unknown numerics mode 9");
}

TEST(PolicyListServerDefaultTest, ExactServerDefaultAnswersExact) {
  Config config = TestConfig();
  config.numerics = Numerics::kExact;
  std::unique_ptr<Server> server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  v1::CompressResponse response;
  ASSERT_TRUE(CallCompress(*stub, MakeRequest("knorm"), &response).ok());
  ASSERT_EQ(response.layers_size(), 1);
  EXPECT_EQ(response.layers(0).numerics(), v1::NUMERICS_EXACT);
  EXPECT_EQ(CounterValue(*server, "kvtrim_layers_total",
                         {{"policy", "knorm"}, {"numerics", "exact"}}),
            1);
}

}  // namespace
}  // namespace kvtrim::service::testing
