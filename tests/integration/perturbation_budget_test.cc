// End to end, max_perturbation budgets (Budget.max_perturbation): the real kvtrimd (CPU
// backend, its own ports) and kvtrim::Client on the bundled stories260K sample (5 layers,
// keys / values [4, 256, 8], queries [8, 32, 8]). Unary and session answers agree; every head
// keeps at most the cap, is within epsilon unless capped, and its list is the keep_tokens = k
// list of the same policy; the refusals carry their code and field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvtrim_client.h"
#include "client/layer_inputs.h"
#include "formats/safetensors.h"
#include "tests/integration/kvtrimd_process.h"

namespace kvtrim {
namespace {

using testing::KvtrimdProcess;

constexpr double kCap = 0.5;  // k_cap = 128 of n = 256

std::vector<v1::LayerInput> SampleLayers() {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(KVTRIM_SAMPLE_PATH);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(*file);
  EXPECT_TRUE(layers.ok()) << layers.status();
  return layers.ok() ? *std::move(layers) : std::vector<v1::LayerInput>();
}

/// dropkv (window 8 of the sample's 32 rows) in exact numerics with `budget`.
v1::CompressionSettings Settings(const v1::Budget& budget) {
  v1::CompressionSettings settings;
  settings.mutable_policy()->set_name("dropkv");
  *settings.mutable_budget() = budget;
  settings.set_numerics(v1::NUMERICS_EXACT);
  settings.set_request_id("integration-max-perturbation");
  return settings;
}

v1::Budget Targeted(double epsilon = 0.05) {
  v1::Budget budget;
  budget.mutable_max_perturbation()->set_epsilon(epsilon);
  budget.mutable_max_perturbation()->set_max_keep_fraction(kCap);
  return budget;
}

std::vector<int32_t> List(const v1::LayerResult& layer, int h) {
  return std::vector<int32_t>(layer.indices().begin() + layer.offsets(h),
                              layer.indices().begin() + layer.offsets(h + 1));
}

class PerturbationBudgetEndToEndTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && process_.has_value()) {
      std::cerr << "---- kvtrimd log ----\n" << process_->Log() << "---------------------\n";
    }
  }

  /// Starts kvtrimd on ports it picks itself (port 0) and connects.
  void StartServer() {
    absl::StatusOr<KvtrimdProcess> process = KvtrimdProcess::Start(
        KVTRIMD_PATH, {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--workers=2",
                       absl::StrCat("--max_message_bytes=", 16 << 20), "--backend=cpu"});
    ASSERT_TRUE(process.ok()) << process.status();
    process_.emplace(*std::move(process));
    absl::StatusOr<testing::KvtrimdAddresses> addresses =
        process_->WaitUntilServing(absl::Seconds(60));
    ASSERT_TRUE(addresses.ok()) << addresses.status();
    ClientOptions options;
    options.max_message_bytes = 16 << 20;
    options.default_deadline = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(addresses->grpc, options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  absl::StatusOr<v1::CompressResponse> Compress(const v1::CompressionSettings& settings,
                                                const std::vector<v1::LayerInput>& layers) {
    v1::CompressRequest request;
    *request.mutable_settings() = settings;
    for (const v1::LayerInput& layer : layers) *request.add_layers() = layer;
    return client_->Compress(request);
  }

  std::optional<KvtrimdProcess> process_;
  std::unique_ptr<Client> client_;
};

TEST_F(PerturbationBudgetEndToEndTest, UnarySessionAndKeepTokensAgree) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::vector<v1::LayerInput> layers = SampleLayers();
  ASSERT_EQ(layers.size(), 5u);
  const int64_t n = layers[0].keys().shape(1);
  const int64_t cap = static_cast<int64_t>(std::floor(kCap * static_cast<double>(n) + 0.5));

  // epsilon: 1.2 x the median statistic at the cap, so that most heads search below it.
  v1::Budget at_cap;
  at_cap.set_keep_fraction(kCap);
  absl::StatusOr<v1::CompressResponse> capped_answer = Compress(Settings(at_cap), layers);
  ASSERT_TRUE(capped_answer.ok()) << capped_answer.status();
  std::vector<double> at_cap_values;
  for (const v1::LayerResult& layer : capped_answer->layers()) {
    for (const v1::HeadStats& head : layer.heads()) at_cap_values.push_back(head.perturbation());
  }
  std::sort(at_cap_values.begin(), at_cap_values.end());
  const double epsilon = 1.2 * at_cap_values[at_cap_values.size() / 2];

  absl::StatusOr<v1::CompressResponse> unary = Compress(Settings(Targeted(epsilon)), layers);
  ASSERT_TRUE(unary.ok()) << unary.status();
  ASSERT_EQ(unary->layers_size(), 5);

  // The session answers each layer the same.
  absl::StatusOr<std::unique_ptr<Session>> session =
      client_->OpenSession(Settings(Targeted(epsilon)));
  ASSERT_TRUE(session.ok()) << session.status();
  for (const v1::LayerInput& layer : layers) ASSERT_TRUE((*session)->SendLayer(layer).ok());
  absl::StatusOr<SessionResult> streamed = (*session)->Finish();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  std::sort(streamed->layers.begin(), streamed->layers.end(),
            [](const auto& a, const auto& b) { return a.layer_id() < b.layer_id(); });
  ASSERT_EQ(streamed->layers.size(), 5u);

  // keep_tokens = k answers for every k the heads chose, to compare lists with.
  std::map<int64_t, v1::CompressResponse> by_count;
  int capped = 0, searched = 0;
  for (const v1::LayerResult& layer : unary->layers()) {
    SCOPED_TRACE(absl::StrCat("layer ", layer.layer_id()));
    EXPECT_EQ(layer.output_shape(), v1::PER_HEAD);
    EXPECT_EQ(layer.numerics(), v1::NUMERICS_EXACT);
    EXPECT_EQ(layer.perturbation_rows(), 32);
    const v1::LayerResult& other = streamed->layers[static_cast<size_t>(layer.layer_id())];
    ASSERT_EQ(layer.heads_size(), other.heads_size());
    for (int h = 0; h < layer.heads_size(); ++h) {
      const v1::HeadStats& head = layer.heads(h);
      ASSERT_TRUE(head.has_perturbation());
      EXPECT_EQ(head.kept(), other.heads(h).kept()) << "head " << h;
      EXPECT_EQ(head.perturbation(), other.heads(h).perturbation()) << "head " << h;
      EXPECT_EQ(List(layer, h), List(other, h)) << "head " << h;
      EXPECT_LE(head.kept(), cap) << "head " << h;
      EXPECT_GE(head.kept(), 8) << "head " << h;  // dropkv's 8 window tokens are protected
      if (head.kept() < cap) {
        EXPECT_LE(head.perturbation(), epsilon) << "head " << h;
        ++searched;
      } else {
        ++capped;
      }
      if (by_count.count(head.kept()) == 0) {
        v1::Budget fixed;
        fixed.set_keep_tokens(head.kept());
        absl::StatusOr<v1::CompressResponse> reference = Compress(Settings(fixed), layers);
        ASSERT_TRUE(reference.ok()) << reference.status();
        by_count[head.kept()] = *std::move(reference);
      }
      const v1::LayerResult& fixed = by_count[head.kept()].layers(layer.layer_id());
      EXPECT_EQ(List(layer, h), List(fixed, h)) << "head " << h << " k " << head.kept();
      EXPECT_EQ(head.perturbation(), fixed.heads(h).perturbation()) << "head " << h;
    }
  }
  std::cout << "max_perturbation " << epsilon << ": " << searched << " heads searched, "
            << capped << " capped at " << cap << "\n";
  EXPECT_GT(searched, 0);
}

TEST_F(PerturbationBudgetEndToEndTest, RefusalsNameTheirField) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  std::vector<v1::LayerInput> layers = SampleLayers();
  ASSERT_FALSE(layers.empty());
  layers.resize(1);
  struct Refusal {
    std::string what;
    std::function<void(v1::CompressionSettings*, v1::LayerInput*)> change;
    std::string prefix;
  };
  const std::vector<Refusal> refusals = {
      {"NaN epsilon",
       [](v1::CompressionSettings* s, v1::LayerInput*) {
         s->mutable_budget()->mutable_max_perturbation()->set_epsilon(std::nan(""));
       },
       "settings.budget.max_perturbation.epsilon: must be finite and >= 0, got nan"},
      {"cap 1.5",
       [](v1::CompressionSettings* s, v1::LayerInput*) {
         s->mutable_budget()->mutable_max_perturbation()->set_max_keep_fraction(1.5);
       },
       "settings.budget.max_perturbation.max_keep_fraction: must be in (0, 1] (0 = 1), got 1.5"},
      {"perturbation off",
       [](v1::CompressionSettings* s, v1::LayerInput*) {
         s->set_perturbation(v1::PERTURBATION_OFF);
       },
       "settings.perturbation: "},
      {"equal count",
       [](v1::CompressionSettings* s, v1::LayerInput*) { s->set_output_shape(v1::EQUAL_COUNT); },
       "settings.output_shape: "},
      {"no values",
       [](v1::CompressionSettings* s, v1::LayerInput* l) {
         s->mutable_policy()->set_name("knorm");
         l->clear_values();
       },
       "layers[0].values: "},
  };
  for (const Refusal& refusal : refusals) {
    v1::CompressionSettings settings = Settings(Targeted());
    std::vector<v1::LayerInput> sent = layers;
    refusal.change(&settings, &sent[0]);
    absl::StatusOr<v1::CompressResponse> answer = Compress(settings, sent);
    ASSERT_FALSE(answer.ok()) << refusal.what;
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << refusal.what;
    EXPECT_EQ(std::string(answer.status().message()).substr(0, refusal.prefix.size()),
              refusal.prefix)
        << refusal.what << ": " << answer.status();
  }
}

}  // namespace
}  // namespace kvtrim
