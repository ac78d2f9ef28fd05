// ScoreScratchBytes / LaunchScore (launchers.h) of the attention scorers (SnapKV, H2O, TOVA,
// DropKV; the key-only scorers are table scorers, kernels/gpu/scorers/). With
// ScorerParams::fast they run the tensor-core passes of fast_attention.cuh (where
// FastAttentionSupported), then the same pooling stage as below. Otherwise they run the
// canonical window attention of kernels/cpu/window_attention.h in three stages:
//   1. LaunchAttentionStats   per-segment partials, then -M, 1/Z (and a, |a|^2) per row
//   2. LaunchAttentionScores  per-token sums over the rows (pre-pooling scores)
//   3. SnapKV: LaunchPoolPrefix pools the prefix P = n - window only (the pooling window
//      clipped at P) and gives the window columns the best pooled prefix score (PoolPrefix
//      of kernels/cpu/pooling.h; run for every kernel, kernel 1 only fills the window).
//      DropKV with kernel > 1: LaunchPool1D over the whole length (dropkv.md §2.3).
// Scratch (attention kinds, fp32 unless stated; H = H_kv, R = rows per KV head = G * rows
// per query head, S = ceil(n / 512)): m_s, z_s [H, R, S]; DropKV o_s [H, R, S, d]; row
// stats [H, R] x 16 B; DropKV a [H, R, d]; pre-pooling scores [H, n] when pooled. Each
// region is 256-byte aligned. Nothing of size [w, n] or [n, d] is ever allocated.
// The model-aware scorers (IsModelScorer) need model tensors and run through LaunchModelScore
// (model_scorers.cu); here they are refused (cudaErrorInvalidValue, 0 scratch bytes).
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
/// both numerics modes): SnapKV pools its prefix, DropKV the whole length when kernel > 1.
cudaError_t PoolScores(ScorerKind kind, const ScorerParams& params, int32_t heads, int64_t n,
                       bool pooled, const float* pre, float* scores, cudaStream_t stream) {
  if (kind == ScorerKind::kSnapKV) {
    const int64_t window = params.window;
    const int64_t prefix = n > window ? n - window : 0;  // P
    return LaunchPoolPrefix(pre, heads, n, prefix, params.kernel, params.pool_max, scores,
                            stream);
  }
  if (!pooled) return cudaSuccess;
  return LaunchPool1D(pre, heads, n, params.kernel, params.pool_max, scores, stream);
}

/// True when `kind` pools through a separate pre-pooling buffer (kernel > 1).
bool PoolsSeparately(ScorerKind kind, const ScorerParams& params) {
  return (kind == ScorerKind::kSnapKV || kind == ScorerKind::kDropKV) && params.kernel > 1;
}

/// Bytes of the fast path's scratch: its own regions plus the pre-pooling scores.
size_t FastScratchBytes(const fast::FastAttentionPlan& plan, ScorerKind kind,
                        const ScorerParams& params) {
  const size_t pre = PoolsSeparately(kind, params)
                         ? static_cast<size_t>(plan.num_kv_heads) * plan.num_tokens * sizeof(float)
                         : 0;
  return plan.scratch_bytes + pre;
}

/// The fast-numerics attention scorers (fast_attention.cuh), then pooling.
cudaError_t LaunchFastScore(ScorerKind kind, const fast::FastAttentionPlan& plan,
                            const DeviceLayer& layer, const ScorerParams& params, float* scores,
                            void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (plan.num_tokens == 0) return cudaSuccess;
  if (scores == nullptr || scratch == nullptr ||
      scratch_bytes < FastScratchBytes(plan, kind, params)) {
    return cudaErrorInvalidValue;
  }
  const bool pooled = PoolsSeparately(kind, params);
  float* pre = pooled
                   ? reinterpret_cast<float*>(static_cast<char*>(scratch) + plan.scratch_bytes)
                   : scores;
  cudaError_t err = fast::LaunchFastAttentionScores(plan, layer, params, scratch, pre, stream);
  if (err != cudaSuccess) return err;
  return PoolScores(kind, params, plan.num_kv_heads, plan.num_tokens, pooled, pre, scores,
                    stream);
}

}  // namespace

size_t ScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params) {
  if (params.fast) {
    fast::FastAttentionPlan fast_plan;
    if (fast::MakeFastAttentionPlan(kind, layer, params, &fast_plan) == cudaSuccess) {
      return FastScratchBytes(fast_plan, kind, params);
    }
  }
  attn::AttentionPlan plan;
  if (attn::MakeAttentionPlan(kind, layer, params, &plan) != cudaSuccess) return 0;
  return plan.scratch_bytes;
}

cudaError_t LaunchScore(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                        float* scores, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (params.fast) {
    fast::FastAttentionPlan fast_plan;
    if (fast::MakeFastAttentionPlan(kind, layer, params, &fast_plan) == cudaSuccess) {
      return LaunchFastScore(kind, fast_plan, layer, params, scores, scratch, scratch_bytes,
                             stream);
    }
  }
  attn::AttentionPlan plan;
  cudaError_t err = attn::MakeAttentionPlan(kind, layer, params, &plan);
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
  return PoolScores(kind, params, plan.num_kv_heads, plan.num_tokens, plan.pooled, pre, scores,
                    stream);
}

}  // namespace kvtrim::gpu
