// Launchers for input tensors that already live in device memory (CUDA IPC regions): a
// gather of a strided / paged layout into dense row-major, and a non-finite probe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/dtype.h"

namespace kvtrim::gpu {

/// A strided / paged source layout on the device (see kvtrim::StridedLayout).
struct DeviceStridedLayout {
  int64_t shape[3];        // [A, N, C]
  int64_t strides[3];      // elements, >= 1
  int64_t block_tokens;    // 0 = not paged
  int64_t block_stride;    // elements between pool blocks
  const int32_t* block_table;  // device [ceil(N / block_tokens)] (paged only)
};

/// Copies the tensor `src` laid out as `layout` into `dst`, dense row-major [A, N, C], of
/// `element_bytes` (2 or 4) per element. One warp per row (i0, i1); rows whose elements are
/// contiguous and 16-byte aligned copy 16 bytes per lane. Asynchronous on `stream`.
cudaError_t LaunchGatherStrided(const void* src, const DeviceStridedLayout& layout,
                                int element_bytes, void* dst, cudaStream_t stream);

/// Sets *first_bad (device) to the lowest flat index i < count whose element of `data`
/// (dense, `dtype`) is NaN or +-Inf, or to ~0ull when none is. Asynchronous on `stream`.
cudaError_t LaunchFindFirstNonFinite(const void* data, DType dtype, int64_t count,
                                     unsigned long long* first_bad, cudaStream_t stream);

}  // namespace kvtrim::gpu
