// SnapKV on the GPU (specs/baselines.md §3): the mean attention of the last `window` query
// rows over the prefix, GQA-mean, the prefix pooled and the window given the best pooled
// prefix score; the shared window-attention kernels (score_dispatch.cu) with these traits,
// bit-identical in exact numerics to kernels/cpu/scorers/snapkv.cc.
#include "kernels/gpu/kernels/window_attention_scorer.h"

namespace kvtrim::gpu {

namespace {

/// SnapKV's window rows, term, normalisation and pooling.
constexpr WindowAttentionTraits kSnapKV{WindowRowSpan::kLastWindow, WindowTerm::kProbability,
                                        WindowNormalize::kRowMean, PoolingSpan::kPrefix};

}  // namespace

/// Adds SnapKV to the GPU scorer table.
void RegisterGpuScorer_snapkv(GpuScorerTable& table) {
  table.Register("snapkv", WindowAttentionScorer<kSnapKV>());
}

}  // namespace kvtrim::gpu
