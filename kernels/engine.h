// PolicyEngine: the one validated entry point from requests to a backend.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/registry.h"

namespace kvtrim {

/// Limits on request sizes checked during validation.
/// Most layers a model may have: layer ids are in [0, kMaxLayers), num_layers <= kMaxLayers
/// (far above any model's; it keeps num_layers = max layer_id + 1 from overflowing).
inline constexpr int32_t kMaxLayers = 1 << 20;

/// OK when `layer_id` is in [0, kMaxLayers); else INVALID_ARGUMENT "<field>.layer_id: ...".
absl::Status CheckLayerId(int64_t layer_id, const std::string& field);

struct EngineLimits {
  int64_t max_tokens = int64_t{1} << 22;       // n per layer
  int64_t max_heads = 1024;                    // H_q and H_kv
  int64_t max_head_dim = 1024;                 // d
  int64_t max_window_rows = 4096;              // w
};

/// Validates requests once (non-virtual) and hands validated layers to the backend.
/// The per-head budget of a layer of `n` tokens under `policy`, as CompressLayer builds it:
/// rule 2 (kept per head), the scorer's protection (or the settings' sink / recent), rule 3.
LayerBudget BudgetFor(const ResolvedPolicy& policy, int64_t n);

class PolicyEngine {
 public:
  PolicyEngine(const PolicyRegistry& registry, Backend& backend, EngineLimits limits = {});

  /// Resolves the policy and checks the settings that do not depend on a layer (budget
  /// range, protected counts, num_layers; a max_perturbation budget's numbers and the settings
  /// it needs, kernels/decide/perturbation_budget.h). `field_prefix` is the message field holding
  /// the settings, e.g. "settings" or "begin"; errors name sub-fields of it.
  absl::StatusOr<ResolvedPolicy> Prepare(const CompressionSettings& settings,
                                         const std::string& field_prefix) const;

  /// Attaches the registered model named by the settings (nullptr when none was named or
  /// found by the caller) and checks what the policy needs from it: FAILED_PRECONDITION
  /// "<field>.model_digest: ..." when a model, its query statistics or its LU-KV profile is
  /// missing; INVALID_ARGUMENT when a profile was built for another scorer, sink or window,
  /// or for combinations a policy does not define (laprox with a non-uniform allocator or a
  /// shared/block output).
  absl::Status AttachModel(ResolvedPolicy* policy, std::shared_ptr<const RegisteredModel> model,
                           const std::string& field_prefix) const;

  /// Validates one layer against the policy (ranks, matching dims, GQA divisibility,
  /// inputs the policy needs, NaN/Inf, budget vs n) and compresses it. Errors are
  /// INVALID_ARGUMENT naming `field_prefix` (e.g. "layers[2]") and the sub-field.
  absl::StatusOr<LayerDecision> CompressLayer(const ResolvedPolicy& policy,
                                              const LayerRequest& layer,
                                              const std::string& field_prefix) const;

  /// Validates one layer and scores it without selecting (model-wide policies: the caller
  /// buffers the scores of every layer and decides with DecideModelWide). The backend may keep
  /// the scores in its own memory (Backend::ScoreLayerForModelWide: LayerScores::resident).
  /// Same errors as CompressLayer. `compute_seconds` receives the scoring time.
  absl::StatusOr<LayerScores> ScoreLayer(const ResolvedPolicy& policy, const LayerRequest& layer,
                                         const std::string& field_prefix,
                                         double* compute_seconds) const;

  /// CompressLayer's second half, on a layer Validate accepted (a session validates on its
  /// reading thread and computes on its own). `field_prefix` qualifies backend errors.
  /// A max_perturbation budget runs Backend::CompressByPerturbation with the bisection of
  /// kernels/decide/perturbation_budget.h.
  absl::StatusOr<LayerDecision> CompressValidated(const ResolvedPolicy& policy,
                                                  const ValidatedLayer& layer,
                                                  const std::string& field_prefix) const;
  /// ScoreLayer's second half, on a layer Validate accepted.
  absl::StatusOr<LayerScores> ScoreValidated(const ResolvedPolicy& policy,
                                             const ValidatedLayer& layer,
                                             const std::string& field_prefix,
                                             double* compute_seconds) const;
  /// Decides a model-wide policy over the layers ScoreLayer / ScoreValidated returned, in
  /// the order given (ties across layers go to the earlier one), on the backend that scored
  /// them (Backend::DecideModelWide): one decision per layer, no perturbation.
  absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(
      const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) const;

  /// Validation alone (used by CompressLayer and by tests).
  absl::StatusOr<ValidatedLayer> Validate(const ResolvedPolicy& policy, const LayerRequest& layer,
                                          const std::string& field_prefix) const;

  const PolicyRegistry& registry() const { return registry_; }
  const char* backend_name() const { return backend_.name(); }
  const EngineLimits& limits() const { return limits_; }

 private:
  const PolicyRegistry& registry_;
  Backend& backend_;
  EngineLimits limits_;
};

}  // namespace kvtrim
