// ScoreScratchBytes / LaunchScore (launchers.h) of the window-attention scorers (SnapKV, H2O,
// TOVA, DropKV), as their WindowAttentionTraits describe them: the launchers their GPU files
// register (kernels/gpu/scorers/<name>.cu, window_attention_scorer.h). The key-only table
// scorers have kernels of their own; the model scorers run through LaunchModelScore. With
// ScorerParams::fast they run the tensor-core passes of fast_attention.cuh (where
// FastAttentionSupported), then the same pooling stage as below. Otherwise they run the
// canonical window attention of kernels/cpu/window_attention.h in three stages:
//   1. LaunchAttentionStats   per-segment partials, then -M, 1/Z (and a, |a|^2) per row
//   2. LaunchAttentionScores  per-token sums over the rows (pre-pooling scores)
//   3. PoolingSpan::kPrefix (SnapKV): LaunchPoolPrefix pools the prefix P = n - window only
//      (the pooling window clipped at P) and gives the window columns the best pooled prefix
//      score (PoolPrefix of kernels/cpu/pooling.h; run for every kernel, kernel 1 only fills
//      the window). kWholeLength (DropKV) with kernel > 1: LaunchPool1D over the whole length
//      (dropkv.md §2.3).
// Scratch (fp32 unless stated; H = H_kv, R = rows per KV head = G * rows per query head,
// S = ceil(n / 512)): m_s, z_s [H, R, S]; with the rows' outputs (kEvictionCost) o_s
// [H, R, S, d]; row stats [H, R] x 16 B; a [H, R, d] (kEvictionCost); pre-pooling scores
// [H, n] when pooled. Each region is 256-byte aligned. Nothing of size [w, n] or [n, d] is
// ever allocated.
#include <cuda_runtime.h>

#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/attention_score.cuh"
#include "kernels/gpu/kernels/attention_stats.cuh"
#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/pooling.cuh"

namespace kvtrim::gpu {

namespace {

/// Pools the pre-pooling scores `pre` [H_kv, n] into `scores` [H_kv, n] (the last stage of
/// both numerics modes): kPrefix pools the prefix, kWholeLength the whole length when
/// kernel > 1.
cudaError_t PoolScores(const WindowAttentionTraits& traits, const ScorerParams& params,
                       int32_t heads, int64_t n, bool pooled, const float* pre, float* scores,
                       cudaStream_t stream) {
  if (traits.pooling == PoolingSpan::kPrefix) {
    const int64_t window = params.window;
    const int64_t prefix = n > window ? n - window : 0;  // P
    return LaunchPoolPrefix(pre, heads, n, prefix, params.kernel, params.pool_max, scores,
                            stream);
  }
  if (!pooled) return cudaSuccess;
  return LaunchPool1D(pre, heads, n, params.kernel, params.pool_max, scores, stream);
}

/// True when a scorer of `traits` pools through a separate pre-pooling buffer (kernel > 1).
bool PoolsSeparately(const WindowAttentionTraits& traits, const ScorerParams& params) {
  return traits.pooling != PoolingSpan::kNone && params.kernel > 1;
}

/// Bytes of the fast path's scratch: its own regions plus the pre-pooling scores.
size_t FastScratchBytes(const fast::FastAttentionPlan& plan, const WindowAttentionTraits& traits,
                        const ScorerParams& params) {
  const size_t pre = PoolsSeparately(traits, params)
                         ? static_cast<size_t>(plan.num_kv_heads) * plan.num_tokens * sizeof(float)
                         : 0;
  return plan.scratch_bytes + pre;
}

/// The fast-numerics attention scorers (fast_attention.cuh), then pooling.
cudaError_t LaunchFastScore(const WindowAttentionTraits& traits,
                            const fast::FastAttentionPlan& plan, const DeviceLayer& layer,
                            const ScorerParams& params, float* scores, void* scratch,
                            size_t scratch_bytes, cudaStream_t stream) {
  if (plan.num_tokens == 0) return cudaSuccess;
  if (scores == nullptr || scratch == nullptr ||
      scratch_bytes < FastScratchBytes(plan, traits, params)) {
    return cudaErrorInvalidValue;
  }
  const bool pooled = PoolsSeparately(traits, params);
  float* pre = pooled
                   ? reinterpret_cast<float*>(static_cast<char*>(scratch) + plan.scratch_bytes)
                   : scores;
  cudaError_t err = fast::LaunchFastAttentionScores(plan, layer, params, scratch, pre, stream);
  if (err != cudaSuccess) return err;
  return PoolScores(traits, params, plan.num_kv_heads, plan.num_tokens, pooled, pre, scores,
                    stream);
}

}  // namespace

size_t ScoreScratchBytes(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                         const ScorerParams& params) {
  if (params.fast) {
    fast::FastAttentionPlan fast_plan;
    if (fast::MakeFastAttentionPlan(traits, layer, params, &fast_plan) == cudaSuccess) {
      return FastScratchBytes(fast_plan, traits, params);
    }
  }
  attn::AttentionPlan plan;
  if (attn::MakeAttentionPlan(traits, layer, params, &plan) != cudaSuccess) return 0;
  return plan.scratch_bytes;
}

cudaError_t LaunchScore(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                        const ScorerParams& params, float* scores, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  if (params.fast) {
    fast::FastAttentionPlan fast_plan;
    if (fast::MakeFastAttentionPlan(traits, layer, params, &fast_plan) == cudaSuccess) {
      return LaunchFastScore(traits, fast_plan, layer, params, scores, scratch, scratch_bytes,
                             stream);
    }
  }
  attn::AttentionPlan plan;
  cudaError_t err = attn::MakeAttentionPlan(traits, layer, params, &plan);
  if (err != cudaSuccess) return err;
  if (plan.num_tokens == 0) return cudaSuccess;
  if (scores == nullptr || scratch_bytes < plan.scratch_bytes ||
      (plan.scratch_bytes > 0 && scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  err = attn::LaunchAttentionStats(plan, layer, scratch, stream);
  if (err != cudaSuccess) return err;
  float* pre = plan.pooled
                   ? reinterpret_cast<float*>(static_cast<char*>(scratch) + plan.pre_pool_offset)
                   : scores;
  err = attn::LaunchAttentionScores(plan, layer, params, scratch, pre, stream);
  if (err != cudaSuccess) return err;
  return PoolScores(traits, params, plan.num_kv_heads, plan.num_tokens, plan.pooled, pre, scores,
                    stream);
}

}  // namespace kvtrim::gpu
