// Device-side input generation for kvtrim_gpu_bench: deterministic pseudo-normal tensors
// written directly in device memory (no host round trip for gigabytes of K/V).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"

namespace kvtrim::gpu::bench {

/// Writes data[0..count) (device, `dtype`) with approximately N(0, scale^2) values: the sum
/// of four uniforms from a counter hash of (seed, index), centred and scaled. The same
/// (seed, index) always gives the same value.
cudaError_t LaunchFillPseudoNormal(void* data, DType dtype, int64_t count, uint64_t seed,
                                   float scale, cudaStream_t stream);

}  // namespace kvtrim::gpu::bench
