// H2O (baselines §2): attention accumulated over every query row sent, GQA-mean.
#include <algorithm>
#include <vector>

#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"

namespace kvtrim {

// For KV head h: score_j = mean_{g in group} sum_{t < w} p_{g,t,j}. With causal_normalize
// the sum is divided by the number of rows that see token j (rows with position >= j);
// a token no row sees scores 0. recent_fraction only affects protection (not read here).
absl::Status ScoreH2O(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                      float* scores) {
  if (absl::Status st = CheckQueryWindow("h2o", layer, layer.shape.window_rows); !st.ok()) {
    return st;
  }
  const bool causal_normalize = params.Bool("causal_normalize");
  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t group = layer.shape.group_size();
  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    std::vector<float> probs(n);   // [n] one attention row
    std::vector<double> acc(n, 0); // [n] sum of p over the group's rows
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = 0; t < w; ++t) {
        const AttentionRowStats row =
            ComputeAttentionRow(layer, h * group + g, t, probs.data(), nullptr);
        for (int64_t j = 0; j < row.visible; ++j) acc[j] += probs[j];
      }
    }
    float* out = scores + h * n;
    for (int64_t j = 0; j < n; ++j) {
      double rows = 1;
      if (causal_normalize) {
        // Row t sees j iff n - w + t >= j, i.e. t >= j - (n - w).
        const int64_t first_row = std::max<int64_t>(0, j - (n - w));
        rows = static_cast<double>(std::max<int64_t>(0, w - first_row));
      }
      out[j] = rows > 0 ? static_cast<float>(acc[j] / (static_cast<double>(group) * rows)) : 0.0f;
    }
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
