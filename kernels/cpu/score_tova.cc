// TOVA (baselines §6): the last query row's attention, averaged over every query head of
// the layer, shared by all KV heads.
#include <algorithm>
#include <vector>

#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"

namespace kvtrim {

// score_j = mean_{q < H_q} p_{q, w-1, j} (the last row sees every token), written to every
// KV head row. Per-KV-head partial sums are combined in head order (deterministic).
absl::Status ScoreTova(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                       float* scores) {
  if (absl::Status st = CheckQueryWindow("tova", layer, 1); !st.ok()) return st;
  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t num_kv = layer.shape.num_kv_heads;
  const int64_t group = layer.shape.group_size();
  std::vector<double> partial(static_cast<size_t>(num_kv * n), 0.0);  // [H_kv, n]
  pool.ParallelFor(num_kv, [&](int64_t h) {
    std::vector<float> probs(n);  // [n] one attention row
    double* acc = partial.data() + h * n;
    for (int64_t g = 0; g < group; ++g) {
      const AttentionRowStats row =
          ComputeAttentionRow(layer, h * group + g, w - 1, probs.data(), nullptr);
      for (int64_t j = 0; j < row.visible; ++j) acc[j] += probs[j];
    }
  });
  const double num_q = static_cast<double>(layer.shape.num_query_heads);
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0;
    for (int64_t h = 0; h < num_kv; ++h) sum += partial[h * n + j];
    scores[j] = static_cast<float>(sum / num_q);
  }
  for (int64_t h = 1; h < num_kv; ++h) std::copy(scores, scores + n, scores + h * n);
  return absl::OkStatus();
}

}  // namespace kvtrim
