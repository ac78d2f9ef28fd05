// FastPerturbationScratchBytes / LaunchFastPerturbation / FastScorerRowsBytes (launchers.h):
// the relative output perturbation of kernels/cpu/perturbation.h in fast numerics, over every
// window row or (the sampled statistic) the last few of every query head. The full and the
// kept attention outputs of every window row come from the fast DropKV pass A and its combine
// (fast_attention.cuh LaunchFastAttentionRows: Q·Kᵀ and P·V on mma.sync, the log2-domain
// online softmax, fp32 accumulation):
//  - the full outputs from a run over every token, or from the DropKV scorer itself when its
//    rows are the statistic's (the sampled statistic of DropKV's default window: the scorer's
//    pass A already computed them, and the pipeline keeps a copy, FastScorerRowsBytes);
//  - the kept outputs from a run over the kept tokens only, gathered from K and V list
//    position by list position, so each softmax has its own maximum as in the CPU's
//    definition and the run costs the kept fraction of a full one.
// Then one CTA per KV head turns the two outputs of each row into ||a_kept - a_full|| /
// ||a_full|| and takes the mean over the rows in a fixed order, in fp64.
//
// Scratch: the full plan's part regions (the largest: the kept run's splits cover fewer
// tiles) and two sets of row statistics and outputs (full, kept).
#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

namespace {

constexpr int kRowThreads = 256;  // threads of the per-head kernel (8 warps, a row per warp)

/// The scratch layout of one layer.
struct FastPerturbPlan {
  fast::FastAttentionPlan attn;  // DropKV's rows: the last `rows` window rows per query head
  fast::FastAttentionPlan kept;  // the same rows, splits over at most kept_bound list positions
  size_t parts_offset = 0;       // the attention plan's part regions
  size_t info_offset[2] = {0, 0};  // [H, rows_total] RowInfo: full, kept
  size_t out_offset[2] = {0, 0};   // [2, H, rows_total, DP] 16-bit planes: full, kept
  size_t bytes = 0;
};

/// Bytes of one set of row statistics and outputs in the attention plan's own layout (its
/// row_info region, then its row_out planes).
size_t RowsRegionBytes(const fast::FastAttentionPlan& attn) {
  const size_t slots = static_cast<size_t>(attn.num_kv_heads) * attn.num_chunks *
                       static_cast<size_t>(attn.chunk_rows);
  return (attn.row_out_offset - attn.row_info_offset) +
         Align256(2 * slots * attn.padded_dim * sizeof(uint16_t));
}

/// Plans the runs over the last `rows` window rows of every query head, the kept one over
/// lists of at most `kept_bound` tokens (< 0 or > n: n); false when the fast kernels do not
/// take the layer.
bool MakeFastPerturbPlan(const DeviceLayer& layer, int32_t rows, int64_t kept_bound,
                         FastPerturbPlan* plan) {
  if (layer.values == nullptr || layer.window_rows < 1 || rows < 1 || rows > layer.window_rows) {
    return false;
  }
  ScorerParams params;
  params.window = rows;  // the last `rows` of the window, with their outputs
  params.kernel = 1;
  params.fast = true;
  FastPerturbPlan p;
  if (fast::MakeFastAttentionPlan(kLastWindowOutputs, layer, params, &p.attn) != cudaSuccess ||
      !p.attn.with_values) {
    return false;
  }
  DeviceLayer kept_layer = layer;
  if (kept_bound >= 0 && kept_bound < layer.num_tokens) kept_layer.num_tokens = kept_bound;
  if (fast::MakeFastAttentionPlan(kLastWindowOutputs, kept_layer, params, &p.kept) !=
      cudaSuccess) {
    return false;
  }
  // The part regions come first in the attention plan's own layout (then its row regions,
  // replaced here by the two sets below, and pass B's partials, not needed). A shorter run
  // may split finer than the full one (split counts round): room for any bound.
  const size_t part_bytes = std::max(p.attn.row_info_offset, p.attn.part_bytes_any_n);
  if (p.kept.row_info_offset > part_bytes) return false;
  size_t offset = 0;
  p.parts_offset = offset;
  offset += Align256(part_bytes);
  const size_t info_to_out = p.attn.row_out_offset - p.attn.row_info_offset;
  for (int set = 0; set < 2; ++set) {
    p.info_offset[set] = offset;
    p.out_offset[set] = offset + info_to_out;
    offset += RowsRegionBytes(p.attn);
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
  return MakeFastPerturbPlan(layer, rows, -1, &plan) ? plan.bytes : 0;
}

size_t FastScorerRowsBytes(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                           const ScorerParams& params, int32_t rows, size_t* scratch_offset) {
  fast::FastAttentionPlan scorer;
  FastPerturbPlan plan;
  if (!params.fast || !traits.ReadsValues() ||
      fast::MakeFastAttentionPlan(traits, layer, params, &scorer) != cudaSuccess ||
      !MakeFastPerturbPlan(layer, rows, -1, &plan)) {
    return 0;
  }
  const fast::FastAttentionPlan& attn = plan.attn;
  // The same rows in the same layout: the scorer's outputs are the full run's, bit for bit
  // (the same pass A over the same splits; its parameters act in pass B only).
  if (scorer.rows != attn.rows || scorer.rows_per_qhead != attn.rows_per_qhead ||
      scorer.first_row != attn.first_row || scorer.chunk_rows != attn.chunk_rows ||
      scorer.num_chunks != attn.num_chunks || scorer.padded_dim != attn.padded_dim ||
      scorer.num_splits != attn.num_splits ||
      scorer.row_out_offset - scorer.row_info_offset != attn.row_out_offset - attn.row_info_offset) {
    return 0;
  }
  if (scratch_offset != nullptr) *scratch_offset = scorer.row_info_offset;
  return RowsRegionBytes(attn);
}

cudaError_t LaunchFastPerturbation(const DeviceLayer& layer, int32_t rows, const int64_t* offsets,
                                   int32_t num_lists, const int32_t* indices, double* out,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream,
                                   const FastPerturbationHints& hints) {
  if (rows < 1 || rows > layer.window_rows) return cudaErrorInvalidValue;
  FastPerturbPlan plan;
  if (!MakeFastPerturbPlan(layer, rows, hints.kept_bound, &plan)) return cudaErrorNotSupported;
  if (out == nullptr || offsets == nullptr || indices == nullptr || scratch == nullptr ||
      scratch_bytes < plan.bytes || (num_lists != 1 && num_lists != layer.num_kv_heads)) {
    return cudaErrorInvalidValue;
  }
  const fast::FastAttentionPlan& attn = plan.attn;
  char* base = static_cast<char*>(scratch);
  char* parts = base + plan.parts_offset;
  // Set 0 (full) is the DropKV scorer's own when the caller kept it.
  char* full = hints.full_rows != nullptr ? static_cast<char*>(const_cast<void*>(hints.full_rows))
                                          : base + plan.info_offset[0];
  const size_t info_to_out = plan.out_offset[0] - plan.info_offset[0];
  auto info = [&](int set) {
    return reinterpret_cast<fast::RowInfo*>(set == 0 ? full : base + plan.info_offset[1]);
  };
  auto rows_out = [&](int set) {
    return static_cast<void*>(set == 0 ? full + info_to_out : base + plan.out_offset[1]);
  };
  cudaError_t err = cudaSuccess;
  if (hints.full_rows == nullptr) {
    err = fast::LaunchFastAttentionRows(attn, layer, nullptr, nullptr, 0, parts, info(0),
                                        rows_out(0), stream);
    if (err != cudaSuccess) return err;
  }
  err = fast::LaunchFastAttentionRows(plan.kept, layer, offsets, indices, num_lists, parts,
                                      info(1), rows_out(1), stream);
  if (err != cudaSuccess) return err;
  const int32_t rows_total = attn.num_chunks * attn.chunk_rows;
  if (attn.num_tokens == 0) {
    // No token: the full outputs are zero (the full run launched nothing).
    const size_t bytes = 2 * static_cast<size_t>(attn.num_kv_heads) * rows_total *
                         attn.padded_dim * sizeof(uint16_t);
    err = cudaMemsetAsync(rows_out(0), 0, bytes, stream);
    if (err != cudaSuccess) return err;
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
