// H2O (baselines §2): attention accumulated over every query row sent, GQA-mean.
#include <algorithm>
#include <vector>

#include "kernels/cpu/fast/window_prob_sums.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"

namespace kvtrim {

// For KV head h (canonical steps 4-5 of window_attention.h):
//   acc_j = seq_{g < G} seq_{t < w} p_{g,t,j};  score_j = CmDiv(acc_j, G * rows_j)
// rows_j = 1, or with causal_normalize the number of rows that see token j (rows with
// position >= j); a token no row sees scores 0. recent_fraction only affects protection.
namespace {

/// H2O in `fast` (FastWindowProbSums) or canonical numerics.
absl::Status H2O(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                 bool fast, float* scores) {
  const bool causal_normalize = params.Bool("causal_normalize");
  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t group = layer.shape.group_size();
  if (fast) FastWindowProbSums(layer, 0, pool, scores);
  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    float* acc = scores + h * n;  // [n] sum of p over the group's rows, in place
    if (!fast) {
      AttentionRowScratch scratch;
      std::fill(acc, acc + n, 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t t = 0; t < w; ++t) {
          const AttentionRowStats row =
              ComputeAttentionRow(layer, h * group + g, t, nullptr, &scratch);
          const float* logits = scratch.logits.data();
          for (int64_t j = 0; j < row.visible; ++j) {
            acc[j] = CmAdd(acc[j], CanonicalProb(logits[j], row.neg_max, row.inv_sum));
          }
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      int64_t rows = 1;
      if (causal_normalize) {
        // Row t sees j iff n - w + t >= j, i.e. t >= j - (n - w).
        const int64_t first_row = std::max<int64_t>(0, j - (n - w));
        rows = std::max<int64_t>(0, w - first_row);
      }
      acc[j] = rows > 0 ? CmDiv(acc[j], static_cast<float>(group * rows)) : 0.0f;
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status ScoreH2O(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                      float* scores) {
  return H2O(layer, params, pool, /*fast=*/false, scores);
}

absl::Status ScoreH2OFast(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                          float* scores) {
  return H2O(layer, params, pool, /*fast=*/true, scores);
}

/// Adds the scorer to the CPU scorer table (its GPU twin: kernels/gpu/scorers/h2o.cu).
void RegisterCpuScorer_h2o(CpuScorerTable& table) {
  table.Register("h2o", {&ScoreH2O, &ScoreH2OFast});
}

}  // namespace kvtrim
