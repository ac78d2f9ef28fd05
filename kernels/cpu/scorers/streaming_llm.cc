// StreamingLLM scorer (specs/baselines.md §1): newer tokens score higher. A table scorer
// (kernels/cpu/cpu_scorer_table.h): its registry entry is in kernels/builtin_policies.cc, its
// device kernel in kernels/gpu/scorers/streaming_llm.cu.
#include <cstdint>

#include "kernels/cpu/cpu_scorer_table.h"

namespace kvtrim {

namespace {

// score[h, j] = j for every head, so the top-k are the most recent k tokens; the sink
// tokens come from the backend's protection (+inf), not from this function. Positions are
// below EngineLimits::max_tokens = 2^22 < 2^24, so float(j) is exact and never ties. No
// arithmetic on K: the same function serves both numerics (the fast path's f16 / bf16 reads
// and statistic then apply).
absl::Status ScoreStreamingLlm(const CpuLayer& layer, const ResolvedParams& params,
                               ThreadPool& pool, float* scores) {
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  pool.ParallelFor(num_heads, [&](int64_t h) {
    float* out = scores + h * n;  // [n] fp32, row h of [H_kv, n]
    for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(j);
  });
  return absl::OkStatus();
}

}  // namespace

void RegisterCpuScorer_streaming_llm(CpuScorerTable& table) {
  table.Register("streaming_llm", {&ScoreStreamingLlm, &ScoreStreamingLlm});
}

}  // namespace kvtrim
