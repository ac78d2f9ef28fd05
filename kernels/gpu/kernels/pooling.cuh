// 1-D pooling of score rows on the GPU, bit-identical to kvtrim::Pool1D
// (kernels/cpu/pooling.h): max over the clipped window, or the double sum over the clipped
// window in index order divided by the kernel in double and rounded once to fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvtrim::gpu {

/// Pools every row of in [rows, n] fp32 (device) into out [rows, n] fp32 (device) with an odd
/// `kernel` >= 1, stride 1, radius kernel / 2; `max_pool` picks max (else avg, zero padding,
/// divided by the full kernel). kernel == 1 copies. `in` and `out` must not overlap.
/// Returns cudaErrorInvalidValue for an even or non-positive kernel, else the launch error.
cudaError_t LaunchPool1D(const float* in, int32_t rows, int64_t n, int32_t kernel, bool max_pool,
                         float* out, cudaStream_t stream);

/// LaunchPool1D over the first `len` entries of rows that lie `in_stride` / `out_stride` floats
/// apart: row r of the input is in[r * in_stride, r * in_stride + len), the pooling window is
/// clipped at len (Pool1D on a length-len vector). kernel == 1 copies. In-place is not allowed.
cudaError_t LaunchPool1DStrided(const float* in, int64_t in_stride, int32_t rows, int64_t len,
                                int32_t kernel, bool max_pool, float* out, int64_t out_stride,
                                cudaStream_t stream);

/// The SnapKV pooling stage, kvtrim::PoolPrefix (kernels/cpu/pooling.h) bit for bit: for every
/// row r of in / out [rows, n] fp32 (device, row stride n), pools the prefix [0, prefix) as
/// Pool1D on a length-`prefix` vector into out[r, 0..prefix), then sets out[r, prefix..n) to
/// the first maximum of out[r, 0..prefix) (0 when prefix == 0). in[r, prefix..n) is never read.
/// in == out is allowed only with kernel == 1 (then the prefix is left as it is); other
/// overlaps are not. Returns cudaErrorInvalidValue for an even or non-positive kernel or
/// prefix outside [0, n], else the launch error.
cudaError_t LaunchPoolPrefix(const float* in, int32_t rows, int64_t n, int64_t prefix,
                             int32_t kernel, bool max_pool, float* out, cudaStream_t stream);

}  // namespace kvtrim::gpu
