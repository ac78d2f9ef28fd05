// TOVA (baselines §6): the last query row's attention, averaged over every query head of
// the layer, shared by all KV heads.
#include <algorithm>
#include <vector>

#include "kernels/cpu/fast/window_prob_sums.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"

namespace kvtrim {

// Canonical steps 4-5 of window_attention.h, row t = w - 1 (it sees every token):
//   s_{h,j} = seq_{g < G} p_{hG+g, w-1, j};  acc_j = seq_{h < H_kv} s_{h,j}
//   score_j = CmDiv(acc_j, H_q), written to every KV head row.
namespace {

/// TOVA in `fast` (FastWindowProbSums) or canonical numerics.
absl::Status Tova(const CpuLayer& layer, ThreadPool& pool, bool fast, float* scores) {
  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t num_kv = layer.shape.num_kv_heads;
  const int64_t group = layer.shape.group_size();
  // Per-KV-head partial sums s_{h,j}, written into the score rows [H_kv, n] first.
  if (fast) {
    FastWindowProbSums(layer, w - 1, pool, scores);
  } else {
    pool.ParallelFor(num_kv, [&](int64_t h) {
      AttentionRowScratch scratch;
      float* partial = scores + h * n;
      std::fill(partial, partial + n, 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        const AttentionRowStats row =
            ComputeAttentionRow(layer, h * group + g, w - 1, nullptr, &scratch);
        const float* logits = scratch.logits.data();
        for (int64_t j = 0; j < row.visible; ++j) {
          partial[j] = CmAdd(partial[j], CanonicalProb(logits[j], row.neg_max, row.inv_sum));
        }
      }
    });
  }
  const float num_q = static_cast<float>(layer.shape.num_query_heads);
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t h = 0; h < num_kv; ++h) acc = CmAdd(acc, scores[h * n + j]);
    scores[j] = CmDiv(acc, num_q);
  }
  for (int64_t h = 1; h < num_kv; ++h) std::copy(scores, scores + n, scores + h * n);
  return absl::OkStatus();
}

}  // namespace

absl::Status ScoreTova(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                       float* scores) {
  (void)params;
  return Tova(layer, pool, /*fast=*/false, scores);
}

absl::Status ScoreTovaFast(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                           float* scores) {
  (void)params;
  return Tova(layer, pool, /*fast=*/true, scores);
}

/// Adds the scorer to the CPU scorer table (its GPU twin: kernels/gpu/scorers/tova.cu).
void RegisterCpuScorer_tova(CpuScorerTable& table) {
  table.Register("tova", {&ScoreTova, &ScoreTovaFast});
}

}  // namespace kvtrim
