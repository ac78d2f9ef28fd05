// K-norm scorer (specs/baselines.md §8): keep the keys with the smallest L2 norm,
// score[h, j] = -||k_j||. A table scorer (kernels/cpu/cpu_scorer_table.h): its registry entry
// is in kernels/builtin_policies.cc, its device kernels in kernels/gpu/scorers/knorm.cu.
#include <cstdint>

#include "kernels/canonical_math.h"
#include "kernels/cpu/cpu_scorer_table.h"
#include "kernels/cpu/fast/key_scores.h"

namespace kvtrim {

namespace {

// score[h, j] = -CmSqrt(CmDot(k, k, d)) with k = keys[h, j, :]: the canonical 8-lane dot
// product (canonical_math.h), so the GPU backend reproduces the bits, and one head per
// task, so the bits do not depend on the thread count.
absl::Status ScoreKnormExact(const CpuLayer& layer, const ResolvedParams& params,
                             ThreadPool& pool, float* scores) {
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int d = static_cast<int>(layer.shape.head_dim);
  pool.ParallelFor(num_heads, [&](int64_t h) {
    float* out = scores + h * n;  // [n] fp32, row h of [H_kv, n]
    for (int64_t j = 0; j < n; ++j) {
      const float* k = layer.keys.row(h, j);  // [d] fp32
      out[j] = -CmSqrt(CmDot(k, k, d));
    }
  });
  return absl::OkStatus();
}

// Fast numerics: the key norms in fp32 SIMD (FastKeyNorms), negated.
absl::Status ScoreKnormFast(const CpuLayer& layer, const ResolvedParams& params,
                            ThreadPool& pool, float* scores) {
  FastKeyNorms(layer, pool, scores);
  const int64_t count = layer.shape.num_kv_heads * layer.shape.num_tokens;
  for (int64_t i = 0; i < count; ++i) scores[i] = -scores[i];
  return absl::OkStatus();
}

}  // namespace

void RegisterCpuScorer_knorm(CpuScorerTable& table) {
  table.Register("knorm", {&ScoreKnormExact, &ScoreKnormFast});
}

}  // namespace kvtrim
