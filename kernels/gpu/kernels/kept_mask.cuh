// The kept-token mask of a layer's lists, read by both output perturbation kernels
// (perturbation.cu in fp64, fast_perturbation.cu on tensor cores).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvtrim::gpu {

/// mask [num_lists, n] uint8 (device): 1 for the tokens of list l (indices[offsets[l] :
/// offsets[l + 1]], device int64 offsets and int32 indices), 0 elsewhere; indices outside
/// [0, n) are ignored. One CTA per list.
cudaError_t LaunchKeptMask(const int64_t* offsets, const int32_t* indices, int32_t num_lists,
                           int64_t n, uint8_t* mask, cudaStream_t stream);

}  // namespace kvtrim::gpu
