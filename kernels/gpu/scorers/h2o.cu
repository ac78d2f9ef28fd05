// H2O on the GPU (specs/baselines.md §2): the attention accumulated over every query row sent,
// GQA-mean, or with causal_normalize divided by the rows that see each token; the shared
// window-attention kernels (score_dispatch.cu) with these traits, bit-identical in exact
// numerics to kernels/cpu/scorers/h2o.cc.
#include "kernels/gpu/kernels/window_attention_scorer.h"

namespace kvtrim::gpu {

namespace {

/// H2O's window rows, term, normalisation (causal_normalize selects kVisibleRowMean) and
/// pooling.
constexpr WindowAttentionTraits kH2O{WindowRowSpan::kAllRows, WindowTerm::kProbability,
                                     WindowNormalize::kGroupMean, PoolingSpan::kNone,
                                     /*causal_normalize_param=*/true};

}  // namespace

/// Adds H2O to the GPU scorer table.
void RegisterGpuScorer_h2o(GpuScorerTable& table) {
  table.Register("h2o", WindowAttentionScorer<kH2O>());
}

}  // namespace kvtrim::gpu
