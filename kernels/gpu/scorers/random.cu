// Random's device kernel (specs/baselines.md §9): score[h, j] = CounterUniform(layer.seed,
// layer.layer_id, h, j), scores [H_kv, n] fp32, bit-identical to kernels/cpu/scorers/random.cc
// (the same kernels/counter_hash.h). No arithmetic on K, so the kernel serves both numerics.
// A table scorer (kernels/gpu/kernels/gpu_scorer_table.h): registered by
// RegisterGpuScorer_random.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/counter_hash.h"
#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/key_scorers_device.cuh"

namespace kvtrim::gpu {

namespace {

/// scores [H, n]: score[h, j] = CounterUniform(seed, layer, h, j). Grid (x, H).
__global__ void RandomKernel(float* scores, int64_t n, uint64_t seed, int32_t layer) {
  const int64_t h = blockIdx.y;
  float* out = scores + h * n;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n;
       j += int64_t{gridDim.x} * blockDim.x) {
    out[j] = CounterUniform(seed, layer, h, j);
  }
}

/// The launcher of both numerics (GpuScorerKernels::launch): reads no tensor, no scratch.
cudaError_t LaunchRandom(const DeviceLayer& layer, const ScorerParams& params, float* scores,
                         void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  bool empty = false;
  if (cudaError_t err = CheckTableLaunch(layer, scores, /*reads_keys=*/false, &empty);
      err != cudaSuccess || empty) {
    return err;
  }
  const int64_t n = layer.num_tokens;
  RandomKernel<<<KeyGrid(n, layer.num_kv_heads), kKeyThreads, 0, stream>>>(scores, n, layer.seed, layer.layer_id);
  return cudaGetLastError();
}

}  // namespace

void RegisterGpuScorer_random(GpuScorerTable& table) {
  GpuScorerKernels kernels;
  kernels.launch = &LaunchRandom;
  table.Register("random", GpuScorer::SameInBothNumerics(kernels));
}

}  // namespace kvtrim::gpu
