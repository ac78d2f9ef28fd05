#include "service/layer_runner.h"

#include <algorithm>

#include "service/response_codec.h"

namespace kvtrim::service {

using Clock = std::chrono::steady_clock;

absl::Status LayerRunner::Failed(const absl::Status& status, double validate_seconds,
                                 Clock::time_point start) {
  core_.metrics().ObserveStage(Stage::kValidate, validate_seconds + SecondsSince(start));
  core_.ReportBackendFailure(status);
  return status;
}

void LayerRunner::ObserveCompute(const LayerDecision& decision, double compute_seconds) {
  if (decision.device < 0) {  // the CPU backend's layers share its threads: no queue
    core_.metrics().ObserveStage(Stage::kCompute, compute_seconds);
    return;
  }
  const double queue = std::clamp(decision.profile.worker_wait, 0.0, compute_seconds);
  core_.metrics().ObserveStage(Stage::kQueue, queue);
  core_.metrics().ObserveStage(Stage::kCompute, compute_seconds - queue);
}

absl::StatusOr<LayerDecision> LayerRunner::Compress(const ResolvedPolicy& policy,
                                                    const LayerRequest& layer,
                                                    const std::string& field) {
  const auto start = Clock::now();
  auto decision = core_.engine().CompressLayer(policy, layer, field);
  const double wall = SecondsSince(start);
  if (!decision.ok()) return Failed(decision.status(), 0, start);
  const double compute = std::min(wall, std::max(0.0, decision->compute_seconds));
  ObserveCompute(*decision, compute);
  core_.metrics().ObserveStage(Stage::kValidate, wall - compute);
  decision->profile.validate = wall - compute;
  return decision;
}

absl::StatusOr<LayerDecision> LayerRunner::CompressValidated(const ResolvedPolicy& policy,
                                                             const ValidatedLayer& layer,
                                                             double validate_seconds) {
  const auto start = Clock::now();
  auto decision = core_.engine().CompressValidated(policy, layer, "layer");
  if (!decision.ok()) return Failed(decision.status(), validate_seconds, start);
  core_.metrics().ObserveStage(Stage::kValidate, validate_seconds);
  ObserveCompute(*decision, std::max(0.0, decision->compute_seconds));
  decision->profile.validate = validate_seconds;
  return decision;
}

absl::Status LayerRunner::Score(const ResolvedPolicy& policy, const LayerRequest& layer,
                                const std::string& field, ModelWideScores* buffered) {
  const auto start = Clock::now();
  double compute = 0;
  auto scores = core_.engine().ScoreLayer(policy, layer, field, &compute);
  const double wall = SecondsSince(start);
  if (!scores.ok()) return Failed(scores.status(), 0, start);
  compute = std::min(wall, std::max(0.0, compute));
  core_.metrics().ObserveStage(Stage::kCompute, compute);
  core_.metrics().ObserveStage(Stage::kValidate, wall - compute);
  buffered->layers.push_back(*std::move(scores));
  buffered->compute_seconds.push_back(compute);
  return absl::OkStatus();
}

absl::Status LayerRunner::ScoreValidated(const ResolvedPolicy& policy,
                                         const ValidatedLayer& layer, double validate_seconds,
                                         ModelWideScores* buffered) {
  const auto start = Clock::now();
  double compute = 0;
  auto scores = core_.engine().ScoreValidated(policy, layer, "layer", &compute);
  if (!scores.ok()) return Failed(scores.status(), validate_seconds, start);
  core_.metrics().ObserveStage(Stage::kValidate, validate_seconds);
  core_.metrics().ObserveStage(Stage::kCompute, compute);
  buffered->layers.push_back(*std::move(scores));
  buffered->compute_seconds.push_back(compute);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerDecision>> LayerRunner::DecideModelWide(
    const ResolvedPolicy& policy, ModelWideScores* buffered) {
  if (buffered->layers.empty()) return std::vector<LayerDecision>{};
  const auto start = Clock::now();
  // The backend that scored the layers decides (on the GPU: scores that never left it).
  auto decisions = core_.engine().DecideModelWide(policy, buffered->layers);
  const double select = SecondsSince(start);
  // The buffered scores (device memory on the GPU backend) are released either way.
  buffered->layers.clear();
  std::vector<double> scoring = std::move(buffered->compute_seconds);
  buffered->compute_seconds.clear();
  if (!decisions.ok()) return Failed(decisions.status(), 0, start);
  core_.metrics().ObserveStage(Stage::kCompute, select);
  const double share = select / static_cast<double>(decisions->size());
  for (size_t i = 0; i < decisions->size(); ++i) {
    (*decisions)[i].compute_seconds = scoring[i] + share;
  }
  return decisions;
}

void LayerRunner::Encode(const CompressionSettings& settings, Clock::time_point received,
                         LayerDecision* decision, v1::LayerResult* out) {
  const auto start = Clock::now();
  EncodeLayerResult(*decision, out, settings.packed_answer);
  const double encode = SecondsSince(start);
  core_.metrics().ObserveStage(Stage::kEncode, encode);
  if (settings.profile) {
    decision->profile.encode = encode;
    decision->profile.server = SecondsSince(received);
    EncodeLayerProfile(decision->profile, out->mutable_profile());
  }
}

}  // namespace kvtrim::service
