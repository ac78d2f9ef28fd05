// KeyDiff scorer (specs/keydiff.md §2.2): score = -cos(k_i, anchor), the anchor the mean
// (unit) key of the head. A table scorer (kernels/cpu/cpu_scorer_table.h): its registry entry
// is in kernels/builtin_policies.cc, its device kernels in kernels/gpu/scorers/keydiff.cu.
// The canonical per-head definition is KeyDiffHeadScores (kernels/cpu/keydiff_block.cc),
// shared with the block-wise simulator; the fast one FastKeyDiffScores
// (kernels/cpu/fast/key_scores.h).
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_scorer_table.h"
#include "kernels/cpu/fast/key_scores.h"
#include "kernels/cpu/keydiff_block.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

namespace {

/// The `anchor` and `eps` parameters (recent_fraction and block_size are protection and
/// validation concerns handled by the registry and the backend).
struct KeyDiffParams {
  KeyDiffAnchor anchor = KeyDiffAnchor::kNormalizedMean;
  float eps = 0;
};

absl::StatusOr<KeyDiffParams> ReadKeyDiffParams(const ResolvedParams& params) {
  if (!params.Has("anchor") || !params.Has("eps")) {
    return absl::InternalError("keydiff: parameters 'anchor' and 'eps' must be declared");
  }
  return KeyDiffParams{params.Enum<KeyDiffAnchor>("anchor"),
                       static_cast<float>(params.Number("eps"))};
}

// Scores every KV head on its own, canonically.
absl::Status ScoreKeyDiffExact(const CpuLayer& layer, const ResolvedParams& params,
                               ThreadPool& pool, float* scores) {
  absl::StatusOr<KeyDiffParams> read = ReadKeyDiffParams(params);
  if (!read.ok()) return read.status();
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  pool.ParallelFor(num_heads, [&](int64_t h) {
    std::vector<float> norms(static_cast<size_t>(n));  // [n] scratch
    KeyDiffHeadScores(layer.keys.row(h, 0), n, d, read->anchor, read->eps, norms.data(),
                      scores + h * n);
  });
  return absl::OkStatus();
}

// Fast numerics: the same definition in fp32 SIMD (FastKeyDiffScores).
absl::Status ScoreKeyDiffFast(const CpuLayer& layer, const ResolvedParams& params,
                              ThreadPool& pool, float* scores) {
  absl::StatusOr<KeyDiffParams> read = ReadKeyDiffParams(params);
  if (!read.ok()) return read.status();
  FastKeyDiffScores(layer, read->anchor, read->eps, pool, scores);
  return absl::OkStatus();
}

}  // namespace

void RegisterCpuScorer_keydiff(CpuScorerTable& table) {
  table.Register("keydiff", {&ScoreKeyDiffExact, &ScoreKeyDiffFast});
}

}  // namespace kvtrim
