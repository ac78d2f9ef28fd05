// K-norm's device kernels (specs/baselines.md §8; docs/policies.md): score[h, j] = -||k_j||
// over keys [H_kv, n, d] of the layer's dtype, written as scores [H_kv, n] fp32.
//   exact  KnormKernel: eight threads per row, one canonical lane each (CmDot, then CmSqrt),
//          bit-identical to the exact scorer of kernels/cpu/scorers/knorm.cc for every dtype.
//   fast   KnormFastKernel: a group of L = DP / 8 lanes per row (16-byte loads, FMA); d a
//          multiple of 8 up to 256.
// A table scorer (kernels/gpu/kernels/gpu_scorer_table.h): registered by RegisterGpuScorer_knorm.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/canonical_math.h"
#include "kernels/gpu/kernels/fast_key_rows.cuh"
#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/key_scorers_device.cuh"

namespace kvtrim::gpu {

namespace {

/// Exact K-norm of head blockIdx.y: eight threads per row (lane = thread % 8) compute the
/// canonical CmDot(k, k, d); scores [H, n] = -CmSqrt of it. Grid (x, H); blockDim a
/// multiple of 32.
template <typename Keys>
__global__ void KnormKernel(Keys keys, int64_t n, int d, float* scores) {
  const int64_t h = blockIdx.y;
  const int64_t items = n * kCanonicalLanes;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  // The loop bound is per warp, so all 32 threads reach the shuffles together.
  const int64_t warp_base = blockIdx.x * int64_t{blockDim.x} + (threadIdx.x & ~31u);
  for (int64_t base = warp_base; base < items; base += stride) {
    const int64_t item = base + (threadIdx.x & 31u);
    const bool valid = item < items;  // rows are whole: 8 | items and 8 | base
    const int64_t j = item / kCanonicalLanes;
    const int lane = static_cast<int>(item % kCanonicalLanes);
    const float part = valid ? CanonicalSquareLane(keys, (h * n + j) * d, d, lane) : 0.0f;
    const float nrm = CmSqrt(CombineCanonicalLanes(part));
    if (valid && lane == 0) scores[h * n + j] = -nrm;
  }
}

/// Fast K-norm: scores[h, j] = -sqrt(Σ k²) (FMA), a group of L lanes per row, 8 elements a
/// lane. Grid (blocks, H); every warp walks the same number of steps.
template <typename T, int L>
__global__ void __launch_bounds__(fast::kKeyRowThreads)
    KnormFastKernel(const void* keys, int64_t n, int32_t d, float* scores) {
  constexpr int kGroups = fast::kKeyRowThreads / L;
  const int h = blockIdx.y;
  const int part = threadIdx.x % L;
  const T* head = static_cast<const T*>(keys) + static_cast<int64_t>(h) * n * d;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroups;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kGroups; base < n; base += stride) {
    const int64_t j = base + threadIdx.x / L;
    float x[8];
    fast::LoadRow(head, j, n, part, d, x);
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss = fmaf(x[i], x[i], ss);
    ss = fast::GroupSum<L>(ss);
    if (part == 0 && j < n) scores[static_cast<int64_t>(h) * n + j] = -sqrtf(ss);
  }
}

/// The exact kernels' launcher (GpuScorerKernels::launch): no scratch.
cudaError_t LaunchKnormExact(const DeviceLayer& layer, const ScorerParams& params, float* scores,
                             void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  bool empty = false;
  if (cudaError_t err = CheckTableLaunch(layer, scores, /*reads_keys=*/true, &empty);
      err != cudaSuccess || empty) {
    return err;
  }
  const int64_t n = layer.num_tokens;
  const int d = layer.head_dim;
  const dim3 grid = KeyGrid(n * kCanonicalLanes, layer.num_kv_heads);
  return WithKeyReader(layer.dtype, layer.keys, [&](auto keys) {
    KnormKernel<<<grid, kKeyThreads, 0, stream>>>(keys, n, d, scores);
    return cudaGetLastError();
  });
}

/// The fast kernels take d a multiple of 8 from 8 to 256, in every dtype.
bool KnormFastSupports(DType dtype, int32_t head_dim) {
  return fast::KeyRowsSupported(head_dim);
}

/// The fast kernels' launcher (GpuScorerKernels::launch): no scratch.
cudaError_t LaunchKnormFast(const DeviceLayer& layer, const ScorerParams& params, float* scores,
                            void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (!KnormFastSupports(layer.dtype, layer.head_dim)) return cudaErrorInvalidValue;
  bool empty = false;
  if (cudaError_t err = CheckTableLaunch(layer, scores, /*reads_keys=*/true, &empty);
      err != cudaSuccess || empty) {
    return err;
  }
  const int64_t n = layer.num_tokens;
  const int32_t d = layer.head_dim;
  return fast::DispatchKeyRows(layer.dtype, d, [&](auto tag, auto lanes) {
    using T = decltype(tag);
    constexpr int L = decltype(lanes)::value;
    const int64_t groups = fast::kKeyRowThreads / L;
    const int64_t blocks = std::min<int64_t>((n + groups - 1) / groups, 8 * fast::SmCount());
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(layer.num_kv_heads));
    KnormFastKernel<T, L><<<grid, fast::kKeyRowThreads, 0, stream>>>(layer.keys, n, d, scores);
    return cudaGetLastError();
  });
}

}  // namespace

void RegisterGpuScorer_knorm(GpuScorerTable& table) {
  GpuScorer knorm;
  knorm.exact.launch = &LaunchKnormExact;
  knorm.fast.supports = &KnormFastSupports;
  knorm.fast.launch = &LaunchKnormFast;
  table.Register("knorm", knorm);
}

}  // namespace kvtrim::gpu
