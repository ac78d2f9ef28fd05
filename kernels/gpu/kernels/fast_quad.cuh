// The quadratic forms of the fast model-aware scorers (fast_model.cu): q_j = x_j M x_j for every
// token row x_j of a KV head and each of its matrices M (Gram matrices: LaProx, CriticalKV l2;
// covariances: Expected Attention, which adds mu . x_j), as a [P, d] x [d, d] product on tensor
// cores with the row-wise dot in the epilogue. M arrives as scaled f16 hi + lo planes
// (PrepareMatsKernel), x as scaled f16 (f32 inputs: hi + lo). Two kernels compute it from the
// same operands with fp32 accumulation: wgmma (Hopper, compute capability 9.0) and mma.sync
// (everything else); they differ only in the order of the fp32 sums.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/gpu/kernels/mma_kernel.h"

namespace kvtrim::gpu {

/// The arguments of one quadratic-form launch.
struct QuadFastArgs {
  const void* x;          // [H_kv, n, d] T (values for the norms, keys for EA)
  const __half* planes;   // [mats][2][DP][DP] (PrepareMatsKernel)
  const float* mat_inv;   // [mats]
  const float* mean;      // [mats][DP] (EA)
  int64_t n;
  int64_t count;          // rows j < count are written
  int64_t num_tiles;      // ceil(count / BM), set by the launcher
  int64_t tile_groups;    // CTAs per matrix, set by the launcher: tiles c, c + tile_groups, ...
  int32_t d, mats_per_kv;
  float scale, half_scale2;  // EA
  float* out;             // [mats, n]: Gram: sqrt(max(0, x M x)); EA: the logits
};

/// Launches the forms of `args` (dp: 64 or 128; num_kv_heads: H_kv; ea: Expected Attention's
/// logits mu . x * scale + x M x * half_scale2, else sqrt(max(0, x M x))) on `stream`.
/// Errors: cudaErrorInvalidValue for another dtype / dp or kWgmma off Hopper.
cudaError_t LaunchQuad(const QuadFastArgs& args, DType dtype, int dp, int32_t num_kv_heads,
                       bool ea, cudaStream_t stream, MmaKernel kernel = MmaKernel::kAuto);

}  // namespace kvtrim::gpu
