// K-norm scorer (specs/baselines.md §8): keep the keys with the smallest L2 norm.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/scorers.h"

namespace kvtrim {

// score[h, j] = -sqrt(sum_c k[h, j, c]^2): fp32 squares accumulated in fp32 in index order
// c = 0..d-1, one head per task, so the bits do not depend on the thread count.
absl::Status ScoreKnorm(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                        float* scores) {
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  pool.ParallelFor(num_heads, [&](int64_t h) {
    float* out = scores + h * n;  // [n] fp32, row h of [H_kv, n]
    for (int64_t j = 0; j < n; ++j) {
      const float* k = layer.keys.row(h, j);  // [d] fp32
      float sum_sq = 0.0f;
      for (int64_t c = 0; c < d; ++c) sum_sq += k[c] * k[c];
      out[j] = -std::sqrt(sum_sq);
    }
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
