// Canonical per-token score accumulation on the GPU (steps 4-5 of
// kernels/cpu/window_attention.h) for SnapKV, H2O, TOVA and DropKV.
#pragma once

#include <cuda_runtime.h>

#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu::attn {

/// Writes the pre-pooling scores [H_kv, n] fp32 into `out` (device) on `stream`, reading
/// the row statistics (and DropKV's outputs a) that LaunchAttentionStats left in the plan's
/// scratch at `scratch`. Grid (ceil(n / tokens per CTA), H_kv) (TOVA: one row of CTAs that
/// loops over the KV heads and writes the shared score to every head). Each token's sum over
/// rows is sequential in the scorer's row order, held by the eight threads of its group.
/// Returns the first launch error. n = 0 launches nothing.
cudaError_t LaunchAttentionScores(const AttentionPlan& plan, const DeviceLayer& layer,
                                  const ScorerParams& params, const void* scratch, float* out,
                                  cudaStream_t stream);

}  // namespace kvtrim::gpu::attn
