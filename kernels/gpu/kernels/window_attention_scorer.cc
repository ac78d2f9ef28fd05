// CopyWindowPooling, ReadWindowAttentionParams and WindowAttentionFastSupports
// (window_attention_scorer.h).
#include "kernels/gpu/kernels/window_attention_scorer.h"

#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/scorer_params.h"

namespace kvtrim::gpu {

void CopyWindowPooling(const ResolvedParams& params, ScorerParams* out) {
  const WindowPooling wp = ReadWindowPooling(params);
  out->window = static_cast<int32_t>(wp.window);
  out->kernel = static_cast<int32_t>(wp.kernel);
  out->pool_max = wp.pooling == PoolKind::kMax;
}

void ReadWindowAttentionParams(const WindowAttentionTraits& traits, const ResolvedParams& params,
                               DType dtype, ScorerParams* out) {
  if (traits.ReadsWindowPooling()) CopyWindowPooling(params, out);
  if (traits.causal_normalize_param) out->causal_normalize = params.Bool("causal_normalize");
  if (traits.ReadsValues()) {
    out->eps = static_cast<float>(params.Number("eps"));
    out->bf16_prob_round =
        RoundsProbToBf16(params.Enum<Bf16ProbRound>("bf16_prob_round"), dtype);
  }
}

bool WindowAttentionFastSupports(DType dtype, int32_t head_dim) {
  return fast::FastAttentionSupported(dtype, head_dim);
}

}  // namespace kvtrim::gpu
