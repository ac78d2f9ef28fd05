// DropKV on the GPU (specs/dropkv.md §2): the eviction cost sum_t (p/(1-p+eps))^2 ||a_t - v_j||^2
// over the last `window` query rows, GQA-mean, max-pooled over the whole length; the shared
// window-attention kernels (score_dispatch.cu) with these traits, bit-identical in exact
// numerics to kernels/cpu/scorers/dropkv.cc. Its fast pass A forms the rows' outputs a_t,
// which the perturbation statistic reuses (FastScorerRowsBytes).
#include "kernels/gpu/kernels/window_attention_scorer.h"

namespace kvtrim::gpu {

namespace {

/// DropKV's window rows, term, normalisation and pooling.
constexpr WindowAttentionTraits kDropKV{WindowRowSpan::kLastWindow, WindowTerm::kEvictionCost,
                                        WindowNormalize::kGroupMean, PoolingSpan::kWholeLength};

}  // namespace

/// Adds DropKV to the GPU scorer table.
void RegisterGpuScorer_dropkv(GpuScorerTable& table) {
  table.Register("dropkv", WindowAttentionScorer<kDropKV>());
}

}  // namespace kvtrim::gpu
