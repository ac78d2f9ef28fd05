// FastPerturbationScratchBytes / LaunchFastPerturbation (launchers.h): the relative output
// perturbation of kernels/cpu/perturbation.h in fast numerics, over every window row or (the
// sampled statistic) the last few of every query head. The full and the kept
// attention outputs of every window row come from two runs of the fast DropKV pass A and its
// combine (fast_attention.cuh LaunchFastAttentionRows: Q·Kᵀ and P·V on mma.sync, the
// log2-domain online softmax, fp32 accumulation), the second with the tokens outside the
// kept set masked out, so each softmax has its own maximum as in the CPU's definition. Then
// one CTA per KV head turns the two outputs of each row into ||a_kept - a_full|| /
// ||a_full|| and takes the mean over the rows in a fixed order, in fp64.
//
// Scratch: mask [lists, n] uint8, the plan's part regions (its statistics and partial
// outputs per token split), and two sets of row statistics and outputs (full, kept).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/gpu/kernels/kept_mask.cuh"
#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

namespace {

constexpr int kRowThreads = 256;  // threads of the per-head kernel (8 warps, a row per warp)

/// The scratch layout of one layer.
struct FastPerturbPlan {
  fast::FastAttentionPlan attn;  // DropKV's rows: the last `rows` window rows per query head
  size_t mask_offset = 0;        // [H_kv, n] uint8 (room for one list per head)
  size_t parts_offset = 0;       // the attention plan's part regions
  size_t info_offset[2] = {0, 0};  // [H, rows_total] RowInfo: full, kept
  size_t out_offset[2] = {0, 0};   // [2, H, rows_total, DP] 16-bit planes: full, kept
  size_t bytes = 0;
};

/// Plans the runs over the last `rows` window rows of every query head; false when the fast
/// kernels do not take the layer.
bool MakeFastPerturbPlan(const DeviceLayer& layer, int32_t rows, FastPerturbPlan* plan) {
  if (layer.values == nullptr || layer.window_rows < 1 || rows < 1 || rows > layer.window_rows) {
    return false;
  }
  ScorerParams params;
  params.window = rows;  // DropKV's rows: the last `rows` of the window
  params.kernel = 1;
  params.fast = true;
  FastPerturbPlan p;
  if (fast::MakeFastAttentionPlan(ScorerKind::kDropKV, layer, params, &p.attn) != cudaSuccess ||
      !p.attn.with_values) {
    return false;
  }
  const size_t slots = static_cast<size_t>(p.attn.num_kv_heads) * p.attn.num_chunks *
                       static_cast<size_t>(p.attn.chunk_rows);
  size_t offset = 0;
  p.mask_offset = offset;
  offset += Align256(static_cast<size_t>(p.attn.num_kv_heads) *
                     static_cast<size_t>(p.attn.num_tokens));
  p.parts_offset = offset;
  // The part regions come first in the attention plan's own layout (then its row regions,
  // replaced here by the two sets below, and pass B's partials, not needed).
  offset += Align256(p.attn.row_info_offset);
  for (int set = 0; set < 2; ++set) {
    p.info_offset[set] = offset;
    offset += Align256(slots * sizeof(fast::RowInfo));
    p.out_offset[set] = offset;
    offset += Align256(2 * slots * p.attn.padded_dim * sizeof(uint16_t));
  }
  p.bytes = offset;
  *plan = p;
  return true;
}

/// a[c] of one row from its 16-bit hi and lo planes.
template <typename CT>
__device__ __forceinline__ float PlaneValue(const CT* hi, size_t plane, int c) {
  return static_cast<float>(hi[c]) + static_cast<float>(hi[plane + c]);
}

/// One CTA per KV head: the mean over its rows of ||a_kept - a_full|| / ||a_full|| (a row
/// with a_full = 0 gives 0 when a_kept = 0 too, else 1), a warp per row in a fixed
/// assignment, the warps' sums added in order, into out[h] (fp64).
template <typename CT>
__global__ void __launch_bounds__(kRowThreads)
    RowPerturbationKernel(const CT* full, const CT* kept, int32_t rows, int32_t rows_total,
                          int32_t num_kv_heads, int32_t dp, int32_t d, double* out) {
  __shared__ double warp_sum[kRowThreads / 32];
  const int h = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const size_t plane = static_cast<size_t>(num_kv_heads) * rows_total * dp;
  double sum = 0;
  for (int r = warp; r < rows; r += kRowThreads / 32) {
    const size_t row = (static_cast<size_t>(h) * rows_total + r) * dp;
    float diff = 0, full_sq = 0, kept_sq = 0;
    for (int c = lane; c < d; c += 32) {
      const float f = PlaneValue(full + row, plane, c);
      const float k = PlaneValue(kept + row, plane, c);
      diff = fmaf(k - f, k - f, diff);
      full_sq = fmaf(f, f, full_sq);
      kept_sq = fmaf(k, k, kept_sq);
    }
    for (int m = 16; m > 0; m >>= 1) {
      diff += __shfl_xor_sync(0xffffffffu, diff, m);
      full_sq += __shfl_xor_sync(0xffffffffu, full_sq, m);
      kept_sq += __shfl_xor_sync(0xffffffffu, kept_sq, m);
    }
    if (full_sq == 0.0f) {
      sum += kept_sq == 0.0f ? 0.0 : 1.0;
    } else {
      sum += sqrt(static_cast<double>(diff) / static_cast<double>(full_sq));
    }
  }
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < kRowThreads / 32; ++i) total += warp_sum[i];
    out[h] = rows > 0 ? total / rows : 0.0;
  }
}

}  // namespace

size_t FastPerturbationScratchBytes(const DeviceLayer& layer, int32_t rows) {
  FastPerturbPlan plan;
  return MakeFastPerturbPlan(layer, rows, &plan) ? plan.bytes : 0;
}

cudaError_t LaunchFastPerturbation(const DeviceLayer& layer, int32_t rows, const int64_t* offsets,
                                   int32_t num_lists, const int32_t* indices, double* out,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (rows < 1 || rows > layer.window_rows) return cudaErrorInvalidValue;
  FastPerturbPlan plan;
  if (!MakeFastPerturbPlan(layer, rows, &plan)) return cudaErrorNotSupported;
  if (out == nullptr || offsets == nullptr || scratch == nullptr ||
      scratch_bytes < plan.bytes || (num_lists != 1 && num_lists != layer.num_kv_heads)) {
    return cudaErrorInvalidValue;
  }
  const fast::FastAttentionPlan& attn = plan.attn;
  char* base = static_cast<char*>(scratch);
  uint8_t* mask = reinterpret_cast<uint8_t*>(base + plan.mask_offset);
  char* parts = base + plan.parts_offset;
  auto info = [&](int set) { return reinterpret_cast<fast::RowInfo*>(base + plan.info_offset[set]); };
  auto rows_out = [&](int set) { return static_cast<void*>(base + plan.out_offset[set]); };
  cudaError_t err = LaunchKeptMask(offsets, indices, num_lists, attn.num_tokens, mask, stream);
  if (err != cudaSuccess) return err;
  err = fast::LaunchFastAttentionRows(attn, layer, nullptr, 0, parts, info(0), rows_out(0), stream);
  if (err != cudaSuccess) return err;
  err = fast::LaunchFastAttentionRows(attn, layer, mask, num_lists == 1 ? 0 : attn.num_tokens,
                                      parts, info(1), rows_out(1), stream);
  if (err != cudaSuccess) return err;
  const int32_t rows_total = attn.num_chunks * attn.chunk_rows;
  if (attn.num_tokens == 0) {
    // No token: every row's outputs are zero (the runs launched nothing).
    const size_t bytes = 2 * static_cast<size_t>(attn.num_kv_heads) * rows_total *
                         attn.padded_dim * sizeof(uint16_t);
    for (int set = 0; set < 2; ++set) {
      err = cudaMemsetAsync(rows_out(set), 0, bytes, stream);
      if (err != cudaSuccess) return err;
    }
  }
  const unsigned grid = static_cast<unsigned>(attn.num_kv_heads);
  if (layer.dtype == DType::kF16) {
    RowPerturbationKernel<__half><<<grid, kRowThreads, 0, stream>>>(
        static_cast<const __half*>(rows_out(0)), static_cast<const __half*>(rows_out(1)),
        attn.rows, rows_total, attn.num_kv_heads, attn.padded_dim, attn.head_dim, out);
  } else {
    // bf16 and f32 inputs: bf16 planes (fast_attention.cu ComputeOf).
    RowPerturbationKernel<__nv_bfloat16><<<grid, kRowThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(rows_out(0)),
        static_cast<const __nv_bfloat16*>(rows_out(1)), attn.rows, rows_total,
        attn.num_kv_heads, attn.padded_dim, attn.head_dim, out);
  }
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
