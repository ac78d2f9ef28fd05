// Test-only: puts the current CUDA context into a sticky error state on purpose.
#pragma once

#include <cuda_runtime.h>

namespace kvtrim::gpu::testing {

/// Launches a kernel that writes through an invalid device pointer on `stream` and waits
/// for it. Returns the error the wait reports (cudaErrorIllegalAddress on a real device).
/// Every later CUDA call in the process fails: run it only in a child process.
cudaError_t InjectStickyFault(cudaStream_t stream);

}  // namespace kvtrim::gpu::testing
