// SnapKV (baselines §3): mean window attention, GQA-mean, then 1-D pooling.
#include <vector>

#include "kernels/cpu/pooling.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"

namespace kvtrim {

// For KV head h (canonical steps 4-6 of window_attention.h):
//   acc_j = seq_{g < G} seq_{t in last `window` rows} p_{g,t,j}
//   score = Pool_kernel(CmDiv(acc_j, G * window))
// Masked (causal) entries add nothing; window tokens keep their finite scores (the backend
// protects them afterwards).
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
  const float denom = static_cast<float>(window * group);
  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    AttentionRowScratch scratch;
    std::vector<float> acc(n, 0.0f);  // [n] seq sum of p over the group's window rows
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = w - window; t < w; ++t) {
        const AttentionRowStats row = ComputeAttentionRow(layer, h * group + g, t, nullptr, &scratch);
        const float* logits = scratch.logits.data();
        for (int64_t j = 0; j < row.visible; ++j) {
          acc[j] = CmAdd(acc[j], CanonicalProb(logits[j], row.neg_max, row.inv_sum));
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) acc[j] = CmDiv(acc[j], denom);
    Pool1D(*kind, acc.data(), n, kernel, scores + h * n);
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
