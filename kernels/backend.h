// The compute interface a backend (CPU or GPU) implements for one validated layer.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/decide.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim {

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
  /// The numerics modes this backend computes `scorer` + `allocator` in (ListPolicies).
  /// kExact is always among them. A request for kFast on a policy whose list lacks it is
  /// computed exact, and LayerDecision::numerics / LayerScores::numerics say so.
  virtual std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                              const AllocatorSpec& allocator) const {
    (void)scorer, (void)allocator;
    return {Numerics::kExact};
  }
  /// True when the backend reads tensors in device memory (MemorySpace::kDevice) in place.
  /// The engine refuses device tensors for backends that do not.
  virtual bool reads_device_memory() const { return false; }
  /// False once the backend hit an unrecoverable (sticky) device error: the server must
  /// turn NOT_SERVING and exit non-zero. The CPU backend is always healthy.
  virtual bool healthy() const { return true; }
};

}  // namespace kvtrim
