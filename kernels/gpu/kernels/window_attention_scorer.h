// The GpuScorer of a window-attention scorer: the shared kernels of LaunchScore (canonical and
// fast, score_dispatch.cu) with the traits the scorer's GPU file declares. A scorer file
// kernels/gpu/scorers/<name>.cu is then its traits and one registration:
//   constexpr WindowAttentionTraits kTraits{...};
//   void RegisterGpuScorer_<name>(GpuScorerTable& table) {
//     table.Register("<name>", WindowAttentionScorer<kTraits>());
//   }
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/window_attention_traits.h"

namespace kvtrim::gpu {

/// Copies a scorer's `window`, `kernel` and `pooling` into `out` (ReadWindowPooling, as the
/// CPU scorers read them; the window-attention and the window-reading model scorers).
void CopyWindowPooling(const ResolvedParams& params, ScorerParams* out);

/// Reads the parameters a scorer of `traits` declares into `out` (read, not checked: the
/// engine validated them): window, kernel and pooling (ReadsWindowPooling), causal_normalize
/// (causal_normalize_param), eps and bf16_prob_round resolved for the input `dtype`
/// (ReadsValues).
void ReadWindowAttentionParams(const WindowAttentionTraits& traits, const ResolvedParams& params,
                               DType dtype, ScorerParams* out);

/// True when the fast window-attention kernels take `dtype` and `head_dim`
/// (fast::FastAttentionSupported).
bool WindowAttentionFastSupports(DType dtype, int32_t head_dim);

namespace window_attention_detail {

/// GpuScorerKernels::scratch_bytes of the scorer of kTraits.
template <const WindowAttentionTraits& kTraits>
size_t ScratchBytes(const DeviceLayer& layer, const ScorerParams& params) {
  return ScoreScratchBytes(kTraits, layer, params);
}

/// GpuScorerKernels::launch of the scorer of kTraits (its numerics: params.fast).
template <const WindowAttentionTraits& kTraits>
cudaError_t Launch(const DeviceLayer& layer, const ScorerParams& params, float* scores,
                   void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  return LaunchScore(kTraits, layer, params, scores, scratch, scratch_bytes, stream);
}

/// GpuScorer::read_params of the scorer of kTraits.
template <const WindowAttentionTraits& kTraits>
void ReadParams(const ResolvedParams& params, DType dtype, ScorerParams* out) {
  ReadWindowAttentionParams(kTraits, params, dtype, out);
}

}  // namespace window_attention_detail

/// The GpuScorer of the window-attention scorer of kTraits (a constexpr object of static
/// storage): the exact kernels take every layer LaunchScore takes, the fast ones the shapes
/// of WindowAttentionFastSupports.
template <const WindowAttentionTraits& kTraits>
GpuScorer WindowAttentionScorer() {
  GpuScorer scorer;
  scorer.exact.scratch_bytes = &window_attention_detail::ScratchBytes<kTraits>;
  scorer.exact.launch = &window_attention_detail::Launch<kTraits>;
  scorer.fast = scorer.exact;
  scorer.fast.supports = &WindowAttentionFastSupports;
  scorer.read_params = &window_attention_detail::ReadParams<kTraits>;
  scorer.window_attention = &kTraits;
  return scorer;
}

}  // namespace kvtrim::gpu
