// SnapKV (baselines §3): mean window attention over the prefix, GQA-mean, then 1-D pooling
// of the prefix.
#include <algorithm>
#include <vector>

#include "kernels/cpu/fast/window_prob_sums.h"
#include "kernels/cpu/pooling.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

// For KV head h (canonical steps 4-6 of window_attention.h), P = max(0, n - window):
//   acc_j = seq_{g < G} seq_{t in last `window` rows} p_{g,t,j}          j < P (prefix only)
//   score[0..P) = Pool_kernel(CmDiv(acc_j, G * window)) over the prefix alone
//   score[P..n) = the largest pooled prefix score (PoolPrefix; 0 when P = 0)
// The softmax still runs over every visible key (window keys in the denominator); only the
// window columns are dropped, so window attention never reaches a prefix score. Masked
// (causal) entries add nothing. The backend protects the window (+inf) afterwards unless the
// request lowers recent_tokens; unprotected window tokens then rank with the best prefix
// token and lose the tie (rule 1: lower index).
namespace {

/// SnapKV in `fast` (FastWindowProbSums) or canonical numerics.
absl::Status SnapKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                    bool fast, float* scores) {
  const WindowPooling wp = ReadWindowPooling(params);
  const int64_t window = wp.window, kernel = wp.kernel;

  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t group = layer.shape.group_size();
  const int64_t prefix = std::max<int64_t>(0, n - window);  // P
  const float denom = static_cast<float>(window * group);
  std::vector<float> fast_sums;  // [H_kv, n]
  if (fast) {
    fast_sums.resize(static_cast<size_t>(layer.shape.num_kv_heads * n));
    FastWindowProbSums(layer, w - window, pool, fast_sums.data());
  }
  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    std::vector<float> acc(prefix, 0.0f);  // [P] sum of p over the group's window rows
    if (fast) {
      for (int64_t j = 0; j < prefix; ++j) acc[j] = fast_sums[h * n + j] / denom;
    } else {
      AttentionRowScratch scratch;
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t t = w - window; t < w; ++t) {
          const AttentionRowStats row =
              ComputeAttentionRow(layer, h * group + g, t, nullptr, &scratch);
          const float* logits = scratch.logits.data();
          const int64_t visible = std::min(row.visible, prefix);
          for (int64_t j = 0; j < visible; ++j) {
            acc[j] = CmAdd(acc[j], CanonicalProb(logits[j], row.neg_max, row.inv_sum));
          }
        }
      }
      for (int64_t j = 0; j < prefix; ++j) acc[j] = CmDiv(acc[j], denom);
    }
    PoolPrefix(wp.pooling, acc.data(), n, prefix, kernel, scores + h * n);
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status ScoreSnapKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores) {
  return SnapKV(layer, params, pool, /*fast=*/false, scores);
}

absl::Status ScoreSnapKVFast(const CpuLayer& layer, const ResolvedParams& params,
                             ThreadPool& pool, float* scores) {
  return SnapKV(layer, params, pool, /*fast=*/true, scores);
}

/// Adds the scorer to the CPU scorer table (its GPU twin: kernels/gpu/scorers/snapkv.cu).
void RegisterCpuScorer_snapkv(CpuScorerTable& table) {
  table.Register("snapkv", {&ScoreSnapKV, &ScoreSnapKVFast});
}

}  // namespace kvtrim
