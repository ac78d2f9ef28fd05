// SnapKV (baselines §3): mean window attention, GQA-mean, then 1-D pooling.
#include <vector>

#include "kernels/cpu/pooling.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"

namespace kvtrim {

// For KV head h: score_j = Pool_kernel( mean_{g in group} mean_{t in last `window` rows}
// p_{g,t,j} ). Masked (causal) entries count as 0 in the mean; window tokens keep their
// finite scores (the backend protects them afterwards).
absl::Status ScoreSnapKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores) {
  const int64_t window = params.Int("window");
  const int64_t kernel = params.Int("kernel");
  if (absl::Status st = CheckQueryWindow("snapkv", layer, window); !st.ok()) return st;
  absl::StatusOr<PoolKind> kind = ResolvePooling("snapkv", params.Text("pooling"), kernel);
  if (!kind.ok()) return kind.status();

  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t group = layer.shape.group_size();
  const double denom = static_cast<double>(window) * static_cast<double>(group);
  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    std::vector<float> probs(n);   // [n] one attention row
    std::vector<double> acc(n, 0); // [n] sum of p over the group's window rows
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = w - window; t < w; ++t) {
        const AttentionRowStats row =
            ComputeAttentionRow(layer, h * group + g, t, probs.data(), nullptr);
        for (int64_t j = 0; j < row.visible; ++j) acc[j] += probs[j];
      }
    }
    for (int64_t j = 0; j < n; ++j) probs[j] = static_cast<float>(acc[j] / denom);
    Pool1D(*kind, probs.data(), n, kernel, scores + h * n);
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
