// A device-side NaN probe over a score tensor: the GPU twin of the CPU backend's check
// that a scorer produced no NaN (kernels/cpu/cpu_backend.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvtrim::gpu {

/// Value of *first_nan when the tensor holds no NaN.
inline constexpr unsigned long long kNoNaN = ~0ull;

/// Sets *first_nan (device, one unsigned long long) to the lowest flat index i < count with
/// values[i] NaN, or to kNoNaN. values: [count] fp32, device. Two launches on `stream`
/// (reset, then scan); no scratch.
cudaError_t LaunchFindFirstNaN(const float* values, int64_t count, unsigned long long* first_nan,
                               cudaStream_t stream);

}  // namespace kvtrim::gpu
