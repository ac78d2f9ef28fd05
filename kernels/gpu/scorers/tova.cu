// TOVA on the GPU (specs/baselines.md §6): the last query row's attention averaged over every
// query head of the layer, one score shared by all KV heads; the shared window-attention
// kernels (score_dispatch.cu) with these traits, bit-identical in exact numerics to
// kernels/cpu/scorers/tova.cc.
#include "kernels/gpu/kernels/window_attention_scorer.h"

namespace kvtrim::gpu {

namespace {

/// TOVA's window rows, term, normalisation and pooling.
constexpr WindowAttentionTraits kTova{WindowRowSpan::kLastRow, WindowTerm::kProbability,
                                      WindowNormalize::kEveryHeadMean, PoolingSpan::kNone};

}  // namespace

/// Adds TOVA to the GPU scorer table.
void RegisterGpuScorer_tova(GpuScorerTable& table) {
  table.Register("tova", WindowAttentionScorer<kTova>());
}

}  // namespace kvtrim::gpu
