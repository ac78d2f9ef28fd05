// The compute interface a backend (CPU or GPU) implements for one validated layer.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/decide/decide.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim {

/// The output perturbation statistic of per-head kept lists on one layer whose inputs a
/// backend holds for the duration of Backend::CompressByPerturbation: the computation,
/// numerics mode and window rows of HeadStats.perturbation for that layer and settings.
class PerturbationProbe {
 public:
  virtual ~PerturbationProbe() = default;
  /// out [H_kv]: the statistic of head h's list indices[offsets[h] : offsets[h + 1]]
  /// (offsets [H_kv + 1], int64; indices int32, ascending within each list). A statistic
  /// that overflowed fp32 in fast numerics is returned as it came (NaN / Inf).
  virtual absl::Status Evaluate(const std::vector<int64_t>& offsets,
                                const std::vector<int32_t>& indices, std::vector<double>* out) = 0;
};

/// Decides one layer of an error-targeted budget from its raw scores (LayerScores with
/// scores [H_kv, n], budget and numerics set) and a probe of the same layer: fills the kept
/// lists, kept_per_head and perturbation of `out` (kernels/decide/perturbation_budget.h).
using PerturbationSearch =
    std::function<absl::Status(const LayerScores& scores, PerturbationProbe& probe,
                               LayerDecision* out)>;

/// A compute backend. Inputs are already validated by PolicyEngine; implementations only
/// compute. Must be safe to call from several threads at once.
class Backend {
 public:
  virtual ~Backend() = default;
  /// "cpu" or "gpu".
  virtual const char* name() const = 0;
  /// Scores, allocates and selects one layer; fills `out` (all fields but compute_seconds).
  virtual absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                     const LayerBudget& budget, LayerDecision* out) = 0;
  /// Scores one layer without selecting (model-wide policies buffer these between layers):
  /// fills out->scores [H_kv, n] with the raw scorer output (no protection) and, for
  /// CriticalKV, out->critical. Every other LayerScores field is set by the caller.
  /// The default answers UNIMPLEMENTED.
  virtual absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                  const LayerBudget& budget, LayerScores* out) {
    (void)policy, (void)layer, (void)budget, (void)out;
    return absl::UnimplementedError(std::string(name()) +
                                    " backend: scoring without selection is not implemented");
  }
  /// Scores one layer of a model-wide policy for a later DecideModelWide on this backend (the
  /// caller keeps every layer's LayerScores until the last): as ScoreLayer, but the backend
  /// may keep the scores in its own memory instead (out->resident set, out->scores and
  /// out->critical empty). The default is ScoreLayer.
  virtual absl::Status ScoreLayerForModelWide(const ResolvedPolicy& policy,
                                              const ValidatedLayer& layer,
                                              const LayerBudget& budget, LayerScores* out) {
    return ScoreLayer(policy, layer, budget, out);
  }
  /// Decides a LaProx policy over `layers` (scored by this backend's ScoreLayerForModelWide or
  /// ScoreLayer), in the order given: ties across layers go to the earlier one. The answer is
  /// DecideLaProx's, one decision per layer in the same order, each with its layer's numerics
  /// and no perturbation. The default runs DecideLaProx on the host (FAILED_PRECONDITION for
  /// scores another backend kept); errors are DecideLaProx's and the backend's own.
  virtual absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(
      const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) {
    for (const LayerScores& layer : layers) {
      if (layer.resident != nullptr) {
        return absl::FailedPreconditionError(
            std::string(name()) + " backend: layer scores are held by another backend");
      }
    }
    absl::StatusOr<std::vector<LayerDecision>> decisions = DecideLaProx(policy, layers);
    if (!decisions.ok()) return decisions.status();
    for (size_t i = 0; i < decisions->size(); ++i) (*decisions)[i].numerics = layers[i].numerics;
    return decisions;
  }
  /// Error-targeted budgets (Budget::by_perturbation): scores the layer (raw, as ScoreLayer),
  /// then calls search(scores, probe, out) once with a probe that evaluates the perturbation
  /// statistic of per-head lists on this layer as often as the search asks (the inputs are
  /// read or staged once per call), and fills the rest of `out` as CompressLayer does
  /// (numerics, perturbation_rows / _sampled, device, profile; the lists to the layer's output
  /// target where it names one the backend writes). The layer has values and queries and the
  /// settings ask for the statistic (the engine checked). The default answers UNIMPLEMENTED.
  virtual absl::Status CompressByPerturbation(const ResolvedPolicy& policy,
                                              const ValidatedLayer& layer,
                                              const LayerBudget& budget,
                                              const PerturbationSearch& search,
                                              LayerDecision* out) {
    (void)policy, (void)layer, (void)budget, (void)search, (void)out;
    return absl::UnimplementedError(std::string(name()) +
                                    " backend: max_perturbation budgets are not implemented");
  }
  /// The numerics modes this backend computes `scorer` + `allocator` in (ListPolicies).
  /// kExact is always among them. A request for kFast on a policy whose list lacks it is
  /// computed exact, and LayerDecision::numerics / LayerScores::numerics say so.
  virtual std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                              const AllocatorSpec& allocator) const {
    (void)scorer, (void)allocator;
    return {Numerics::kExact};
  }
  /// True when the backend finds NaN / Inf in the keys of `policy`'s layers itself, fused
  /// into its own read of them: the engine then skips its scan of the (host) keys, sets
  /// ValidatedLayer::unchecked_keys_field, and the backend answers a non-finite key with the
  /// engine's own error (CheckFinite) before anything else.
  virtual bool ChecksKeysFinite(const ResolvedPolicy& policy) const {
    (void)policy;
    return false;
  }
  /// True when the backend reads tensors in device memory (MemorySpace::kDevice) in place.
  /// The engine refuses device tensors for backends that do not.
  virtual bool reads_device_memory() const { return false; }
  /// False once the backend hit an unrecoverable (sticky) device error: the server must
  /// turn NOT_SERVING and exit non-zero. The CPU backend is always healthy.
  virtual bool healthy() const { return true; }
};

/// A backend that reads host tensors, which a device backend falls back to for the layers
/// its kernels cannot take (a head dimension over their limit) and for the fp64 statistic
/// where its fp32 one overflowed. The CPU backend is one; the device backend receives it
/// from whoever creates both (service/backend_factory.cc), so neither depends on the other.
class HostFallback : public Backend {
 public:
  /// The exact (fp64, every window row) perturbation statistic of decision->offsets /
  /// indices on `layer` (host tensors, values and queries present) into decision.
  virtual void ExactPerturbation(const ValidatedLayer& layer, LayerDecision* decision) = 0;
};

}  // namespace kvtrim
