// From scores to kept indices, shared by both backends: protection, allocation (uniform,
// pyramid, adakv, lukv), CriticalKV's two-stage selection and every output shape. A backend
// computes the scores (bit-identical on CPU and GPU) and either runs this on the host or
// reproduces it exactly on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim {

/// The scores of one layer before any selection.
struct LayerScores {
  int32_t layer_id = 0;
  int32_t num_layers = 1;
  int64_t num_heads = 0;          // H_kv
  int64_t num_tokens = 0;         // n
  std::vector<float> scores;      // [H_kv, n] raw scorer output (no protection applied)
  std::vector<float> critical;    // [H_kv, n] CriticalKV stage-2 scores, else empty
  LayerBudget budget;             // uniform k and its clamped protection
  Numerics numerics = Numerics::kExact;  // the mode that computed the scores
};

/// Per-head token counts of the layer's allocator (uniform, pyramid, adakv, lukv) for the
/// per-head output. `protected_scores` is scores with the uniform protection applied (+inf).
/// lukv errors (missing profile, mismatched layout) are FAILED_PRECONDITION / INVALID_ARGUMENT.
absl::StatusOr<std::vector<int64_t>> AllocateCounts(const ResolvedPolicy& policy,
                                                    const LayerScores& layer,
                                                    const std::vector<float>& protected_scores);

/// Decides one layer from its scores (every output shape, every allocator, CriticalKV's two
/// stages). Fills every LayerDecision field except perturbation and compute_seconds.
/// Model-wide LaProx modes are decided by DecideLaProx instead.
absl::Status DecideLayer(const ResolvedPolicy& policy, const LayerScores& layer,
                         LayerDecision* out);

/// LaProx selection (laprox.md §2.2-2.3) over `layers` (scores = p, window/protected tokens
/// excluded), by params "mode": local, layer, model_raw, model. Ties: (layer order as given,
/// head, token) lexicographic. Returns one decision per layer in the same order.
absl::StatusOr<std::vector<LayerDecision>> DecideLaProx(const ResolvedPolicy& policy,
                                                        const std::vector<LayerScores>& layers);

}  // namespace kvtrim
