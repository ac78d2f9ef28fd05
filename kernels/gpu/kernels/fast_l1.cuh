// CriticalKV's projected value norms in fast numerics (fast_model.cu, "CriticalKV l1"):
// n_q[j] = ||v_j W_O^q||_1 for every prefix token j and query head q, as a [P, d] x [d, D]
// product per query head on tensor cores with |.| and the row sum in the epilogue.
// Two kernels compute it with the same operands (f16 W_O image, scaled f16 token rows) and
// fp32 accumulation: wgmma (Hopper, compute capability 9.0) and mma.sync (everything else);
// they differ only in the order of the fp32 sums.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"
#include "kernels/gpu/kernels/mma_kernel.h"

namespace kvtrim::gpu {

/// The arguments of one L1 launch.
struct L1FastArgs {
  const void* values;    // [H_kv, n, d] T
  const __half* w16;     // [H_q, D, DP] scaled f16 (FastWoImage)
  const float* w_inv;    // [H_q] 2^-k_q
  int64_t n;
  int64_t count;         // P: rows j < count are scored
  int64_t num_tiles;     // ceil(count / BM), set by the launcher
  int32_t d, hidden, group;
  float* out;            // [H_q, n]: n_q[j] for j < count
};

/// Launches the norms of `args` (dp: 64 or 128, the padded head dimension; num_kv_heads:
/// H_kv) on `stream`. Errors: cudaErrorInvalidValue for another dtype / dp or kWgmma off
/// Hopper.
cudaError_t LaunchL1(const L1FastArgs& args, DType dtype, int dp, int32_t num_kv_heads,
                     cudaStream_t stream, MmaKernel kernel = MmaKernel::kAuto);

}  // namespace kvtrim::gpu
