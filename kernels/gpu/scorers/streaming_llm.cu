// StreamingLLM's device kernel (specs/baselines.md §1): score[h, j] = float(j), scores
// [H_kv, n] fp32, bit-identical to kernels/cpu/scorers/streaming_llm.cc. No arithmetic on K,
// so the kernel serves both numerics. A table scorer (kernels/gpu/kernels/gpu_scorer_table.h):
// registered by RegisterGpuScorer_streaming_llm.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/key_scorers_device.cuh"

namespace kvtrim::gpu {

namespace {

/// scores [H, n]: score[h, j] = float(j). Grid (x, H).
__global__ void PositionKernel(float* scores, int64_t n) {
  float* out = scores + static_cast<int64_t>(blockIdx.y) * n;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    out[j] = static_cast<float>(j);
  }
}

/// The launcher of both numerics (GpuScorerKernels::launch): reads no tensor, no scratch.
cudaError_t LaunchPositions(const DeviceLayer& layer, const ScorerParams& params, float* scores,
                            void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  bool empty = false;
  if (cudaError_t err = CheckTableLaunch(layer, scores, /*reads_keys=*/false, &empty);
      err != cudaSuccess || empty) {
    return err;
  }
  const int64_t n = layer.num_tokens;
  PositionKernel<<<KeyGrid(n, layer.num_kv_heads), kKeyThreads, 0, stream>>>(scores, n);
  return cudaGetLastError();
}

}  // namespace

void RegisterGpuScorer_streaming_llm(GpuScorerTable& table) {
  GpuScorerKernels kernels;
  kernels.launch = &LaunchPositions;
  table.Register("streaming_llm", GpuScorer::SameInBothNumerics(kernels));
}

}  // namespace kvtrim::gpu
