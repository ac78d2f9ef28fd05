// End-to-end test: the real kvtrimd binary as a child process, driven through the real
// kvtrim::Client with the bundled stories260K prefill sample (5 layers, keys/values
// [4, 256, 8], queries [8, 32, 8], f32). Every preset ListPolicies reports runs unary and as a
// session; the answers are checked against the budget rules, compared with each other, and
// the /metrics exposition is checked for exactly the series those calls must have produced.
// Finally SIGTERM must make kvtrimd exit with status 0.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/kvtrim_client.h"
#include "client/layer_inputs.h"
#include "client/model_bundle.h"
#include "formats/safetensors.h"
#include "tests/integration/kvtrimd_process.h"
#include "tests/integration/metrics_scrape.h"

namespace kvtrim {
namespace {

using testing::KvtrimdProcess;
using testing::MetricsSnapshot;

constexpr double kKeepFraction = 0.25;
constexpr uint64_t kSeed = 1234;

/// Rule 2 of the spec: tokens kept per head out of n.
int64_t BudgetPerHead(double fraction, int64_t n) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(fraction * n + 0.5)));
}

/// The sample's layers and their shapes.
struct Sample {
  std::vector<v1::LayerInput> layers;  // ordered by layer id
  int64_t kv_heads = 0;                // H_kv
  int64_t tokens = 0;                  // n
  int64_t window = 0;                  // w
};

absl::StatusOr<Sample> LoadSample() {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(KVTRIM_SAMPLE_PATH);
  if (!file.ok()) return file.status();
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(*file);
  if (!layers.ok()) return layers.status();
  Sample sample;
  sample.layers = *std::move(layers);
  sample.kv_heads = sample.layers[0].keys().shape(0);
  sample.tokens = sample.layers[0].keys().shape(1);
  sample.window = sample.layers[0].queries().shape(1);
  return sample;
}

/// PyramidKV's beta for the sample: with k = 64 and SnapKV's 32 protected window tokens the
/// default beta = 20 gives a last-layer budget 64 / 20 < 32, which falls back to uniform
/// (docs/policies.md); beta = 1.5 gives the feasible schedule 85 .. 43.
constexpr double kPyramidBeta = 1.5;

/// The request settings for one preset: the fixed budget, any `window` parameter lowered
/// to the sample's w query rows so that every windowed policy can run on it, and a pyramid
/// `beta` whose schedule is feasible for the sample.
/// True when the policy reads a registered model (W_O, statistics or an LU-KV profile).
bool NeedsModel(const v1::PolicyInfo& policy) {
  for (int input : policy.inputs()) {
    if (input == v1::POLICY_INPUT_MODEL || input == v1::POLICY_INPUT_PROFILE) return true;
  }
  return false;
}

/// True when the answer is decided over every layer at once (LaProx's default mode).
bool ModelWide(const v1::PolicyInfo& policy) { return policy.scorer() == "laprox"; }

v1::CompressionSettings SettingsFor(const v1::PolicyInfo& policy, const Sample& sample,
                                    const std::string& model_digest = "") {
  v1::CompressionSettings settings;
  if (NeedsModel(policy)) settings.set_model_digest(model_digest);
  settings.mutable_policy()->set_name(policy.name());
  auto& params = *settings.mutable_policy()->mutable_params();
  for (const v1::ParamSpec& param : policy.params()) {
    if (param.name() == "window" && param.default_number() > sample.window) {
      params["window"].set_number(sample.window);
    }
    if (param.name() == "beta" && policy.allocator() == "pyramid") {
      params["beta"].set_number(kPyramidBeta);
    }
  }
  settings.mutable_budget()->set_keep_fraction(kKeepFraction);
  settings.set_num_layers(static_cast<int32_t>(sample.layers.size()));
  settings.set_output_shape(v1::PER_HEAD);
  settings.set_seed(kSeed);
  settings.set_request_id(absl::StrCat("integration-", policy.name()));
  // Fast asked for explicitly: the CPU backend computes it where it has a fast path (the
  // policy lists FAST first), exact otherwise, and says which.
  settings.set_numerics(v1::NUMERICS_FAST);
  return settings;
}

/// Checks one layer's structure: CSR offsets, ascending in-range indices, per-head stats,
/// the numerics it says computed it.
/// Returns the kept count per head.
std::vector<int64_t> CheckLayerStructure(const v1::LayerResult& layer, const Sample& sample,
                                         bool expect_perturbation, v1::Numerics numerics) {
  SCOPED_TRACE(absl::StrCat("layer ", layer.layer_id()));
  const int64_t n = sample.tokens, heads = sample.kv_heads;
  EXPECT_EQ(layer.num_tokens(), n);
  EXPECT_EQ(layer.output_shape(), v1::PER_HEAD);
  EXPECT_EQ(layer.numerics(), numerics);  // fast asked: what the policy lists first
  EXPECT_GE(layer.compute_seconds(), 0.0);
  std::vector<int64_t> kept;
  if (layer.offsets_size() != heads + 1 || layer.heads_size() != heads) {
    ADD_FAILURE() << "offsets " << layer.offsets_size() << " heads " << layer.heads_size();
    return kept;
  }
  EXPECT_EQ(layer.offsets(0), 0);
  EXPECT_EQ(layer.offsets(heads), layer.indices_size());
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t begin = layer.offsets(h), end = layer.offsets(h + 1);
    if (begin > end || end > layer.indices_size()) {
      ADD_FAILURE() << "head " << h << ": offsets [" << begin << ", " << end << ")";
      return kept;
    }
    kept.push_back(end - begin);
    EXPECT_EQ(layer.heads(h).kept(), end - begin) << "head " << h;
    for (int64_t i = begin; i < end; ++i) {
      EXPECT_GE(layer.indices(i), 0) << "head " << h;
      EXPECT_LT(layer.indices(i), n) << "head " << h;
      if (i > begin) {
        EXPECT_LT(layer.indices(i - 1), layer.indices(i)) << "head " << h;
      }
    }
    // Values and queries were sent, so the perturbation is reported (not for model-wide
    // answers: their K/V are gone when every layer is decided).
    if (!expect_perturbation) {
      EXPECT_FALSE(layer.heads(h).has_perturbation()) << "head " << h;
      continue;
    }
    EXPECT_TRUE(layer.heads(h).has_perturbation()) << "head " << h;
    EXPECT_TRUE(std::isfinite(layer.heads(h).perturbation())) << "head " << h;
    EXPECT_GE(layer.heads(h).perturbation(), 0.0) << "head " << h;
  }
  return kept;
}

/// Checks every layer of one answer and the budget rule of the policy's allocator:
/// uniform: every head keeps k; adakv (and any other per-layer allocator): each layer keeps
/// H_kv * k in total; pyramid: heads of a layer keep the same count, non-increasing with
/// depth, first + last = 2k (+-1 from rounding), averaging k.
void CheckAnswer(const v1::PolicyInfo& policy, const std::vector<v1::LayerResult>& layers,
                 const Sample& sample) {
  ASSERT_EQ(layers.size(), sample.layers.size());
  const int64_t k = BudgetPerHead(kKeepFraction, sample.tokens);
  std::vector<int64_t> per_layer;  // pyramid: the count of each layer, by layer id
  int64_t model_total = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(layers[l].layer_id(), static_cast<int32_t>(l));
    std::vector<int64_t> kept = CheckLayerStructure(layers[l], sample, !ModelWide(policy),
                                                    policy.numerics_modes(0));
    if (kept.empty()) continue;
    int64_t total = 0;
    for (int64_t c : kept) total += c;
    model_total += total;
    if (ModelWide(policy)) {
      continue;  // LaProx: only the model-wide total is fixed (below)
    } else if (policy.allocator() == "lukv") {
      for (int64_t c : kept) EXPECT_GE(c, 1) << "layer " << l;  // ragged per-head budgets
    } else if (policy.allocator() == "uniform") {
      for (size_t h = 0; h < kept.size(); ++h) {
        EXPECT_EQ(kept[h], k) << "layer " << l << " head " << h;
      }
    } else if (policy.allocator() == "pyramid") {
      for (int64_t c : kept) EXPECT_EQ(c, kept[0]) << "layer " << l;
      per_layer.push_back(kept[0]);
    } else {
      EXPECT_EQ(total, sample.kv_heads * k) << "layer " << l;
    }
  }
  if (ModelWide(policy)) {
    EXPECT_EQ(model_total, static_cast<int64_t>(layers.size()) * sample.kv_heads * k);
  }
  if (policy.allocator() == "pyramid" && per_layer.size() == layers.size()) {
    double sum = 0;
    for (size_t l = 0; l < per_layer.size(); ++l) {
      sum += per_layer[l];
      if (l > 0) {
        EXPECT_LE(per_layer[l], per_layer[l - 1]) << "layer " << l;
      }
    }
    EXPECT_LT(per_layer.back(), per_layer.front());
    // k_0 = 2k - k_{L-1} before each is rounded half up.
    EXPECT_NEAR(per_layer.front() + per_layer.back(), 2 * k, 1);
    EXPECT_NEAR(sum / per_layer.size(), static_cast<double>(k), 1.0);
  }
}

/// Unary and session answers must be identical (same backend, same seed).
void ExpectSameAnswers(std::vector<v1::LayerResult> unary, std::vector<v1::LayerResult> session) {
  ASSERT_EQ(unary.size(), session.size());
  for (size_t l = 0; l < unary.size(); ++l) {
    SCOPED_TRACE(absl::StrCat("layer ", unary[l].layer_id()));
    EXPECT_EQ(unary[l].layer_id(), session[l].layer_id());
    EXPECT_EQ(std::vector<int64_t>(unary[l].offsets().begin(), unary[l].offsets().end()),
              std::vector<int64_t>(session[l].offsets().begin(), session[l].offsets().end()));
    EXPECT_EQ(std::vector<int32_t>(unary[l].indices().begin(), unary[l].indices().end()),
              std::vector<int32_t>(session[l].indices().begin(), session[l].indices().end()));
    ASSERT_EQ(unary[l].heads_size(), session[l].heads_size());
    for (int h = 0; h < unary[l].heads_size(); ++h) {
      EXPECT_NEAR(unary[l].heads(h).perturbation(), session[l].heads(h).perturbation(), 1e-12);
    }
  }
}

/// What the test sent for one policy, to compare with the metrics.
struct Expected {
  int unary_calls = 0;
  int session_calls = 0;
  int64_t layers = 0;
  int64_t tokens_in = 0;
  int64_t tokens_kept = 0;
  int64_t head_observations = 0;
};

void Account(const std::vector<v1::LayerResult>& layers, Expected* expected) {
  for (const v1::LayerResult& layer : layers) {
    ++expected->layers;
    expected->tokens_in += layer.num_tokens() * layer.heads_size();
    expected->head_observations += layer.heads_size();
    for (const v1::HeadStats& head : layer.heads()) expected->tokens_kept += head.kept();
  }
}

class KvtrimdEndToEndTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && process_.has_value()) {
      std::cerr << "---- kvtrimd log ----\n" << process_->Log() << "---------------------\n";
    }
  }

  /// Starts kvtrimd on ports it picks itself (port 0) and waits (bounded) for SERVING.
  void StartServer() {
    absl::StatusOr<KvtrimdProcess> process = KvtrimdProcess::Start(
        KVTRIMD_PATH,
        {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--workers=2",
         "--max_inflight=16", absl::StrCat("--max_message_bytes=", 16 << 20), "--backend=cpu"});
    ASSERT_TRUE(process.ok()) << process.status();
    process_.emplace(*std::move(process));
    absl::StatusOr<testing::KvtrimdAddresses> addresses =
        process_->WaitUntilServing(absl::Seconds(60));
    ASSERT_TRUE(addresses.ok()) << addresses.status();
    metrics_port_ = addresses->metrics_port();
    ASSERT_GT(metrics_port_, 0) << addresses->metrics;
    target_ = addresses->grpc;

    ClientOptions options;
    options.max_message_bytes = 16 << 20;
    options.default_deadline = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target_, options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    absl::StatusOr<HealthState> state = client_->Health();
    ASSERT_TRUE(state.ok()) << state.status();
    ASSERT_EQ(*state, HealthState::kServing);
  }

  /// Scrapes /metrics until no request is in flight (bounded), then parses it.
  MetricsSnapshot Scrape() {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    for (;;) {
      absl::StatusOr<std::string> body = testing::HttpGet("127.0.0.1", metrics_port_, "/metrics");
      EXPECT_TRUE(body.ok()) << body.status();
      if (!body.ok()) return MetricsSnapshot({});
      absl::StatusOr<std::vector<testing::Sample>> samples = testing::ParseExposition(*body);
      EXPECT_TRUE(samples.ok()) << samples.status();
      if (!samples.ok()) return MetricsSnapshot({});
      MetricsSnapshot snapshot(*std::move(samples));
      if (snapshot.Sum("kvtrim_inflight_requests", {}) == 0 || absl::Now() > deadline) {
        return snapshot;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::optional<KvtrimdProcess> process_;
  std::unique_ptr<Client> client_;
  std::string target_;  // the address kvtrimd bound
  int metrics_port_ = 0;
};

TEST_F(KvtrimdEndToEndTest, EveryPresetUnaryAndSessionThenMetricsThenSigterm) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  absl::StatusOr<Sample> sample = LoadSample();
  ASSERT_TRUE(sample.ok()) << sample.status();
  ASSERT_EQ(sample->layers.size(), 5u);
  ASSERT_EQ(sample->tokens, 256);
  ASSERT_EQ(sample->window, 32);

  absl::StatusOr<v1::ListPoliciesResponse> policies = client_->ListPolicies();
  ASSERT_TRUE(policies.ok()) << policies.status();
  std::vector<v1::PolicyInfo> presets;  // compositions are named "SCORER+ALLOCATOR"
  for (const v1::PolicyInfo& policy : policies->policies()) {
    if (policy.name().find('+') == std::string::npos) presets.push_back(policy);
  }
  ASSERT_FALSE(presets.empty());

  // The bundled registration of the sample's model (W_O, query statistics, snapkv profile)
  // for the presets that need one.
  absl::StatusOr<ModelBundle> bundle = ReadModelBundle(KVTRIM_MODEL_BUNDLE_PATH);
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  absl::StatusOr<std::string> digest = client_->RegisterModel(*bundle);
  ASSERT_TRUE(digest.ok()) << digest.status();

  // A second client whose sessions send large tensors as 1000-byte chunks.
  ClientOptions chunking;
  chunking.max_message_bytes = 16 << 20;
  chunking.default_deadline = absl::Seconds(30);
  chunking.session_chunk_bytes = 1000;
  absl::StatusOr<std::unique_ptr<Client>> chunking_client = Client::Connect(target_, chunking);
  ASSERT_TRUE(chunking_client.ok()) << chunking_client.status();

  std::map<std::string, Expected> expected;
  for (const v1::PolicyInfo& policy : presets) {
    SCOPED_TRACE(absl::StrCat("policy ", policy.name()));
    // The CPU backend computes every policy fast by default, the model-aware ones included.
    ASSERT_EQ(policy.numerics_modes_size(), 2);
    EXPECT_EQ(policy.numerics_modes(0), v1::NUMERICS_FAST);
    EXPECT_EQ(policy.numerics_modes(1), v1::NUMERICS_EXACT);
    const v1::CompressionSettings settings = SettingsFor(policy, *sample, *digest);
    Expected& e = expected[policy.name()];

    v1::CompressRequest request;
    *request.mutable_settings() = settings;
    for (const v1::LayerInput& layer : sample->layers) *request.add_layers() = layer;
    absl::StatusOr<v1::CompressResponse> unary = client_->Compress(request);
    ++e.unary_calls;
    ASSERT_TRUE(unary.ok()) << unary.status();
    EXPECT_EQ(unary->backend(), "cpu");
    std::vector<v1::LayerResult> unary_layers(unary->layers().begin(), unary->layers().end());
    CheckAnswer(policy, unary_layers, *sample);
    Account(unary_layers, &e);

    absl::StatusOr<std::unique_ptr<Session>> session = client_->OpenSession(settings);
    ++e.session_calls;
    ASSERT_TRUE(session.ok()) << session.status();
    for (const v1::LayerInput& layer : sample->layers) {
      ASSERT_TRUE((*session)->SendLayer(layer).ok());
    }
    absl::StatusOr<SessionResult> result = (*session)->Finish();
    ASSERT_TRUE(result.ok()) << result.status();
    std::sort(result->layers.begin(), result->layers.end(),
              [](const auto& a, const auto& b) { return a.layer_id() < b.layer_id(); });
    CheckAnswer(policy, result->layers, *sample);
    Account(result->layers, &e);
    EXPECT_EQ(result->summary.layers(), static_cast<int32_t>(sample->layers.size()));
    EXPECT_EQ(result->summary.tokens_in(),
              static_cast<int64_t>(sample->layers.size()) * sample->kv_heads * sample->tokens);
    int64_t kept = 0;
    for (const v1::LayerResult& layer : result->layers) {
      for (const v1::HeadStats& head : layer.heads()) kept += head.kept();
    }
    EXPECT_EQ(result->summary.tokens_kept(), kept);
    EXPECT_EQ(result->summary.backend(), "cpu");
    ExpectSameAnswers(unary_layers, result->layers);

    // The same layers sent from the caller's memory (LayerTensorBytes) in 1000-byte chunks.
    absl::StatusOr<std::unique_ptr<Session>> borrowing =
        (*chunking_client)->OpenSession(settings);
    ++e.session_calls;
    ASSERT_TRUE(borrowing.ok()) << borrowing.status();
    for (const v1::LayerInput& layer : sample->layers) {
      v1::LayerInput header = layer;
      LayerTensorBytes bytes;
      auto borrow = [](const v1::Tensor& from, v1::Tensor* to, absl::Span<const char>* span) {
        if (from.data_case() != v1::Tensor::kInlineData) return;
        *span = absl::MakeConstSpan(from.inline_data());
        to->clear_inline_data();
      };
      if (layer.has_keys()) borrow(layer.keys(), header.mutable_keys(), &bytes.keys);
      if (layer.has_values()) borrow(layer.values(), header.mutable_values(), &bytes.values);
      if (layer.has_queries()) borrow(layer.queries(), header.mutable_queries(), &bytes.queries);
      ASSERT_TRUE((*borrowing)->SendLayer(std::move(header), bytes).ok());
    }
    absl::StatusOr<SessionResult> borrowed = (*borrowing)->Finish();
    ASSERT_TRUE(borrowed.ok()) << borrowed.status();
    std::sort(borrowed->layers.begin(), borrowed->layers.end(),
              [](const auto& a, const auto& b) { return a.layer_id() < b.layer_id(); });
    Account(borrowed->layers, &e);
    ExpectSameAnswers(unary_layers, borrowed->layers);
  }

  // One deliberately bad request: a budget outside (0, 1].
  v1::CompressRequest bad;
  *bad.mutable_settings() = SettingsFor(presets[0], *sample);
  bad.mutable_settings()->mutable_budget()->set_keep_fraction(1.5);
  *bad.add_layers() = sample->layers[0];
  absl::StatusOr<v1::CompressResponse> rejected = client_->Compress(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rejected.status().message().find("keep_fraction: must be in (0, 1]"),
            std::string::npos)
      << rejected.status();

  const MetricsSnapshot metrics = Scrape();
  for (const auto& [name, e] : expected) {
    SCOPED_TRACE(absl::StrCat("metrics of policy ", name));
    EXPECT_EQ(metrics.Sum("kvtrim_requests_total",
                          {{"rpc", "Compress"}, {"policy", name}, {"code", "OK"}}),
              e.unary_calls);
    EXPECT_EQ(metrics.Sum("kvtrim_requests_total",
                          {{"rpc", "CompressSession"}, {"policy", name}, {"code", "OK"}}),
              e.session_calls);
    EXPECT_EQ(metrics.Sum("kvtrim_layers_total", {{"policy", name}}), e.layers);
    EXPECT_EQ(metrics.Sum("kvtrim_tokens_in_total", {{"policy", name}}), e.tokens_in);
    EXPECT_EQ(metrics.Sum("kvtrim_tokens_kept_total", {{"policy", name}}), e.tokens_kept);
    EXPECT_EQ(metrics.Sum("kvtrim_kept_ratio_count", {{"policy", name}}), e.head_observations);
    // Model-wide answers (laprox) carry no perturbation statistic.
    EXPECT_EQ(metrics.Sum("kvtrim_perturbation_ratio_count", {{"policy", name}}),
              name == "laprox" ? 0 : e.head_observations);
    EXPECT_NEAR(metrics.Sum("kvtrim_kept_ratio_sum", {{"policy", name}}),
                static_cast<double>(e.tokens_kept) / sample->tokens, 1e-6);
  }
  EXPECT_EQ(metrics.Sum("kvtrim_requests_total", {{"rpc", "Compress"}, {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(metrics.Sum("kvtrim_requests_total", {{"rpc", "Compress"}}), presets.size() + 1);
  EXPECT_EQ(metrics.Sum("kvtrim_request_duration_seconds_count", {{"rpc", "Compress"}}),
            presets.size() + 1);
  EXPECT_EQ(metrics.Sum("kvtrim_request_duration_seconds_count", {{"rpc", "CompressSession"}}),
            2 * presets.size());  // each preset's session of whole layers and of chunks
  EXPECT_GT(metrics.Sum("kvtrim_request_bytes_total", {{"rpc", "Compress"}}), 0);
  EXPECT_GT(metrics.Sum("kvtrim_stage_duration_seconds_count", {{"stage", "compute"}}), 0);
  EXPECT_EQ(metrics.Count("kvtrim_inflight_requests", {}), 1);
  EXPECT_EQ(metrics.Sum("kvtrim_inflight_requests", {}), 0);
  EXPECT_EQ(metrics.Count("kvtrim_build_info", {}), 1);
  EXPECT_EQ(metrics.Sum("kvtrim_build_info", {}), 1);

  absl::StatusOr<int> wait_status = process_->StopWith(SIGTERM, absl::Seconds(30));
  ASSERT_TRUE(wait_status.ok()) << wait_status.status();
  ASSERT_TRUE(WIFEXITED(*wait_status)) << "kvtrimd ended by signal " << WTERMSIG(*wait_status);
  EXPECT_EQ(WEXITSTATUS(*wait_status), 0);
}

}  // namespace
}  // namespace kvtrim
