// Random scorer (specs/baselines.md §9): a seeded, deterministic U[0, 1) score per token. A
// table scorer (kernels/cpu/cpu_scorer_table.h): its registry entry is in
// kernels/builtin_policies.cc, its device kernel in kernels/gpu/scorers/random.cu.
#include <cstdint>

#include "kernels/counter_hash.h"
#include "kernels/cpu/cpu_scorer_table.h"

namespace kvtrim {

namespace {

// score[h, j] = CounterUniform(seed, layer_id, h, j). Stateless, so the result does not
// depend on the thread count or on the order heads are visited, and the GPU backend
// reproduces it bit for bit from the same header. No arithmetic on K: the same function
// serves both numerics.
absl::Status ScoreRandom(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores) {
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const uint64_t seed = layer.seed;
  const int32_t layer_id = layer.layer_id;
  pool.ParallelFor(num_heads, [&](int64_t h) {
    float* out = scores + h * n;  // [n] fp32, row h of [H_kv, n]
    for (int64_t j = 0; j < n; ++j) out[j] = CounterUniform(seed, layer_id, h, j);
  });
  return absl::OkStatus();
}

}  // namespace

void RegisterCpuScorer_random(CpuScorerTable& table) {
  table.Register("random", {&ScoreRandom, &ScoreRandom});
}

}  // namespace kvtrim
