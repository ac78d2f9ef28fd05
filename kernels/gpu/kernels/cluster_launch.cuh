// Launching a kernel as one thread-block cluster per grid row (sm_90): the grid (C, rows) with
// clusters of C CTAs along x, so that the C CTAs of a row share distributed shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvtrim::gpu {

/// Launches kernel<<<(cluster, rows), threads, smem, stream>>>(args...) with clusters of
/// `cluster` CTAs along x (1 <= cluster <= 8, the portable cluster size; rows <= 65535).
template <typename... Params, typename... Args>
cudaError_t LaunchClusterRows(void (*kernel)(Params...), int64_t cluster, int64_t rows,
                              int threads, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster), static_cast<unsigned>(rows));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace kvtrim::gpu
