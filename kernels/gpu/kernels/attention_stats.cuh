// Canonical row statistics on the GPU (steps 1-3 of kernels/cpu/window_attention.h):
// per-segment partials streamed over K/V tiles, then one combine per row.
#pragma once

#include <cuda_runtime.h>

#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu::attn {

/// Computes the RowStats [H_kv, R] (and, with plan.with_output, the outputs a [H_kv, R, d])
/// of every scored row into the plan's scratch regions at `scratch`, on `stream`:
///   kernel 1, grid (ceil(R / 16), segments, H_kv): one CTA per (16 rows, 512-token segment,
///            KV head) writes m_s, z_s (and o_s [d]);
///   kernel 2, grid (R, H_kv): combines the segments of one row into -M, 1/Z (a, |a|^2).
/// Never materialises a [w, n] matrix: the logits of one segment live in shared memory.
/// Returns the first launch error. n = 0 launches nothing.
cudaError_t LaunchAttentionStats(const AttentionPlan& plan, const DeviceLayer& layer,
                                 void* scratch, cudaStream_t stream);

}  // namespace kvtrim::gpu::attn
