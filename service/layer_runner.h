// The layer runner shared by Compress and CompressSession: one layer through the engine
// (or, for model-wide policies, scored and decided at the end), timed, with its answer.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "service/service_core.h"

namespace kvtrim::service {

/// Scores of a model-wide policy buffered between layers (scores only, never K/V; on the
/// GPU backend they stay in device memory, LayerScores::resident, freed with the entries).
struct ModelWideScores {
  std::vector<LayerScores> layers;
  std::vector<double> compute_seconds;  // scoring time of each buffered layer
};

/// Runs layers through the engine for one call and observes the validate / compute /
/// encode stages. Failures of the computation go to the backend-failure hook when INTERNAL.
/// Not thread-safe: one per call, used from one thread at a time.
class LayerRunner {
 public:
  explicit LayerRunner(ServiceCore& core) : core_(core) {}

  /// Validates and compresses one layer (per-layer policies).
  absl::StatusOr<LayerDecision> Compress(const ResolvedPolicy& policy, const LayerRequest& layer,
                                         const std::string& field);
  /// Compresses a layer the engine already validated (`validate_seconds` spent on that).
  absl::StatusOr<LayerDecision> CompressValidated(const ResolvedPolicy& policy,
                                                  const ValidatedLayer& layer,
                                                  double validate_seconds);
  /// Validates and scores one layer of a model-wide policy into `buffered`.
  absl::Status Score(const ResolvedPolicy& policy, const LayerRequest& layer,
                     const std::string& field, ModelWideScores* buffered);
  /// Scores a validated layer of a model-wide policy into `buffered`.
  absl::Status ScoreValidated(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                              double validate_seconds, ModelWideScores* buffered);
  /// Decides every buffered layer at once on the backend that scored them
  /// (PolicyEngine::DecideModelWide) and empties the buffer, also on failure. Each layer
  /// reports its own scoring time plus an equal share of the selection.
  absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(const ResolvedPolicy& policy,
                                                             ModelWideScores* buffered);

  /// Encodes `decision` into `out` (packed when the settings ask) and, with
  /// settings.profile, its per-stage times including the encode and the server time since
  /// `received`; observes the encode stage.
  void Encode(const CompressionSettings& settings, std::chrono::steady_clock::time_point received,
              LayerDecision* decision, v1::LayerResult* out);

 private:
  /// A computation failed: observes the time as validation, reports INTERNAL to the
  /// backend-failure hook, returns `status`.
  absl::Status Failed(const absl::Status& status, double validate_seconds,
                      std::chrono::steady_clock::time_point start);

  /// Observes a computed layer's `compute_seconds`: on a device, its wait for a free worker
  /// as the queue stage and the rest as compute; on the CPU backend all of it as compute.
  void ObserveCompute(const LayerDecision& decision, double compute_seconds);

  ServiceCore& core_;
};

}  // namespace kvtrim::service
