// From scores to kept indices, shared by both backends: protection, allocation (uniform,
// pyramid, adakv, lukv), CriticalKV's two-stage selection and every output shape. A backend
// computes the scores (bit-identical on CPU and GPU) and either runs this on the host or
// reproduces it exactly on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim {

/// Scores a backend keeps in its own memory (a GPU buffer) between
/// Backend::ScoreLayerForModelWide and Backend::DecideModelWide. Opaque to everyone but the
/// backend that made it; the memory is released with the last reference.
class ResidentScores {
 public:
  virtual ~ResidentScores() = default;
  /// Bytes the scores occupy in the backend's memory.
  virtual size_t bytes() const = 0;
};

/// The scores of one layer before any selection.
struct LayerScores {
  int32_t layer_id = 0;
  int32_t num_layers = 1;
  int64_t num_heads = 0;          // H_kv
  int64_t num_tokens = 0;         // n
  std::vector<float> scores;      // [H_kv, n] raw scorer output (no protection applied)
  std::vector<float> critical;    // [H_kv, n] CriticalKV stage-2 scores, else empty
  /// Set instead of `scores` when the backend keeps the scores itself (ScoreLayerForModelWide);
  /// only that backend's DecideModelWide reads them.
  std::shared_ptr<const ResidentScores> resident;
  LayerBudget budget;             // uniform k and its clamped protection
  Numerics numerics = Numerics::kExact;  // the mode that computed the scores
  int32_t device = -1;            // CUDA device ordinal that scored the layer (-1: CPU)
};

/// Per-head token counts of the layer's allocator (uniform, pyramid, adakv, lukv) for the
/// per-head output. `protected_scores` is scores with the uniform protection applied (+inf).
/// lukv errors (missing profile, mismatched layout) are FAILED_PRECONDITION / INVALID_ARGUMENT.
absl::StatusOr<std::vector<int64_t>> AllocateCounts(const ResolvedPolicy& policy,
                                                    const LayerScores& layer,
                                                    const std::vector<float>& protected_scores);

/// The ranking a layer's decision selects by, and the counts and protection behind it.
struct LayerRanking {
  std::vector<float> ranked;           // [H, n] fp32 row-major: protected tokens (and
                                       // CriticalKV's stage-1 tokens) at +inf
  std::vector<int64_t> counts;         // [H] tokens each head keeps (AllocateCounts)
  std::vector<Protection> protection;  // [H] each head's protection (per head for lukv)
};

/// The first steps of DecideLayer: protection (uniform, or per head on lukv's own counts),
/// the allocation, and for CriticalKV (layer.critical set) the two-stage ranking: the
/// stage-2 scores with every protected and every stage-1 token at +inf.
absl::StatusOr<LayerRanking> RankLayer(const ResolvedPolicy& policy, const LayerScores& layer);

/// CriticalKV's stage-1 set size of one head of n tokens: its protected tokens plus
/// b1 = round_half_up(alpha * b) (in double; specs README rule 6), b = count - protected,
/// at most n.
int64_t CriticalKVStage1Tokens(double alpha, int64_t count, const Protection& protection,
                               int64_t n);

/// Decides one layer from its scores (every output shape, every allocator, CriticalKV's two
/// stages). Fills every LayerDecision field except perturbation and compute_seconds.
/// Model-wide LaProx modes are decided by DecideLaProx instead.
absl::Status DecideLayer(const ResolvedPolicy& policy, const LayerScores& layer,
                         LayerDecision* out);

/// What one LaProx top-K ranges over (laprox.md §2.3).
enum class LaProxScope {
  kHead,   // mode local, and every EQUAL_COUNT mode: top-(k - protected) in each head
  kLayer,  // mode layer: the heads of a layer together, H_kv * (k - protected)
  kModel,  // modes model and model_raw: every layer and head at once
};

/// How DecideLaProx selects, from params "mode" and the output shape.
struct LaProxPlan {
  LaProxScope scope = LaProxScope::kModel;
  /// Mode model (not EQUAL_COUNT): each layer's candidates are divided by their canonical sum
  /// (NormalizeLaProxLayer) before the top-K.
  bool normalize = false;
};

/// The plan of `policy` (a laprox policy). INVALID_ARGUMENT for SHARED and BLOCK_ALIGNED
/// outputs, which LaProx does not define.
absl::StatusOr<LaProxPlan> PlanLaProx(const ResolvedPolicy& policy);

/// LaProx mode model's layer normalisation (laprox.md §2.2), in place over the `count`
/// candidate scores of one layer in (head, token) order (protected tokens left out):
/// z = CmChunkedSum of the values, then v = CmDiv(v, z), or 0 when z is not positive.
void NormalizeLaProxLayer(float* values, int64_t count);

/// LaProx selection (laprox.md §2.2-2.3) over `layers` (scores = p, window/protected tokens
/// excluded), by params "mode": local, layer, model_raw, model. Ties: (layer order as given,
/// head, token) lexicographic. Returns one decision per layer in the same order.
absl::StatusOr<std::vector<LayerDecision>> DecideLaProx(const ResolvedPolicy& policy,
                                                        const std::vector<LayerScores>& layers);

}  // namespace kvtrim
