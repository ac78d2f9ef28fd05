// PerturbationScratchBytes / LaunchPerturbation (launchers.h): the relative output
// perturbation of kernels/cpu/perturbation.h on the GPU, in fp64. The order of the sums
// differs from the CPU (streamed per token tile with an online maximum, then combined per
// segment), which the definition allows: the result matches the CPU to ~1e-12 relative.
//
// Stages (H = H_kv, R = G * w rows per KV head, d <= 256):
//   1. BuildMaskKernel      kept mask [lists, n] uint8 from the CSR lists
//   2. SegmentKernel        grid (ceil(R / 16), segments, H): per (row, segment) the running
//                           max, sum and output accumulator of the full and the kept softmax
//   3. CombineKernel        grid (R, H): the row's ||a_kept - a_full|| / ||a_full||
//   4. MeanKernel           grid (H): the mean over the head's R rows, in row order
// Scratch: mask [lists, n] uint8, partials [H, R, segments, 2d + 4] f64, row values [H, R] f64,
// each region 256-byte aligned; segments = min(ceil(n / 64), ceil(512 / (H ceil(R / 16)))).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/gpu/kernels/attention_common.cuh"
#include "kernels/gpu/kernels/kept_mask.cuh"
#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

namespace {

using attn::kMaxHeadDim;
using attn::ToF32;
using attn::VisibleCount;

constexpr int kRows = 16;        // rows per CTA
constexpr int kTile = 64;        // tokens per tile
constexpr int kThreads = 256;
constexpr int kTargetCtas = 512; // segments are added until the grid has about this many CTAs
constexpr int kCombineThreads = 128;

/// Layout of the perturbation scratch for one layer.
struct PerturbPlan {
  int32_t num_kv = 0, group = 0, rows = 0, d = 0, w = 0;
  int64_t n = 0;
  int32_t row_blocks = 0;     // ceil(R / 16)
  int64_t segments = 0;       // token segments per row
  int64_t seg_tokens = 0;     // tokens per segment (a multiple of kTile)
  int32_t acc_per_thread = 0; // ceil(d / 16) rounded up to 4, 8 or 16
  size_t mask_offset = 0, partial_offset = 0, value_offset = 0, bytes = 0;
  /// Doubles per (row, segment) partial: m, s, acc[d] for the full and the kept softmax.
  int64_t PartialWidth() const { return 2 * static_cast<int64_t>(d) + 4; }
};

/// Plans the stages; false when the layer cannot be handled (then nothing is launched).
bool MakePlan(const DeviceLayer& layer, int32_t num_lists, PerturbPlan* plan) {
  PerturbPlan p;
  p.num_kv = layer.num_kv_heads;
  p.n = layer.num_tokens;
  p.d = layer.head_dim;
  p.w = layer.window_rows;
  if (p.num_kv < 1 || p.n < 0 || p.d < 1 || p.d > kMaxHeadDim || p.w < 1 ||
      layer.num_query_heads < p.num_kv || layer.num_query_heads % p.num_kv != 0) {
    return false;
  }
  p.group = layer.num_query_heads / p.num_kv;
  p.rows = p.group * p.w;
  p.row_blocks = (p.rows + kRows - 1) / kRows;
  const int64_t tiles = (p.n + kTile - 1) / kTile;
  const int64_t ctas = static_cast<int64_t>(p.num_kv) * p.row_blocks;
  int64_t segments = (kTargetCtas + ctas - 1) / ctas;
  segments = segments < 1 ? 1 : (segments > tiles ? tiles : segments);
  if (segments < 1) segments = 1;
  const int64_t tiles_per_seg = (tiles + segments - 1) / segments;
  p.seg_tokens = (tiles_per_seg < 1 ? 1 : tiles_per_seg) * kTile;
  p.segments = (p.n + p.seg_tokens - 1) / p.seg_tokens;
  if (p.segments < 1) p.segments = 1;
  if (p.segments > 65535) return false;
  const int need = (p.d + 15) / 16;
  p.acc_per_thread = need <= 4 ? 4 : (need <= 8 ? 8 : 16);
  const int64_t lists = num_lists < 1 ? 1 : num_lists;
  size_t offset = 0;
  p.mask_offset = offset;
  offset += Align256(static_cast<size_t>(lists) * static_cast<size_t>(p.n));
  p.partial_offset = offset;
  offset += Align256(static_cast<size_t>(p.num_kv) * p.rows * p.segments * p.PartialWidth() *
                     sizeof(double));
  p.value_offset = offset;
  offset += Align256(static_cast<size_t>(p.num_kv) * p.rows * sizeof(double));
  p.bytes = offset;
  *plan = p;
  return true;
}

/// One CTA per list: mask[list, j] = 1 for the kept tokens of the list, else 0.
__global__ void BuildMaskKernel(const int64_t* offsets, const int32_t* indices, int64_t n,
                                uint8_t* mask) {
  const int list = blockIdx.x;
  uint8_t* row = mask + static_cast<int64_t>(list) * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) row[j] = 0;
  __syncthreads();
  for (int64_t i = offsets[list] + threadIdx.x; i < offsets[list + 1]; i += blockDim.x) {
    const int32_t j = indices[i];
    if (j >= 0 && j < n) row[j] = 1;
  }
}

/// Arguments of the segment kernel.
struct SegmentArgs {
  const void* keys;     // [H, n, d] T
  const void* values;   // [H, n, d] T
  const void* queries;  // [H_q, w, d] T
  const uint8_t* mask;  // [lists, n]
  bool shared_list;
  int64_t n, seg_tokens, segments;
  int32_t d, w, rows, group;
  double scale;
  double* partials;     // [H, R, segments, 2d + 4]
};

/// Padded row stride (floats) of the query and key tiles: float4-aligned, 4-bank skew.
__host__ __device__ constexpr int TileStride(int d) { return (d + 3) / 4 * 4 + 4; }

/// Dynamic shared memory of the segment kernel for head dim d and ACC accumulators.
size_t SegmentSmemBytes(int d, int acc) {
  return sizeof(float) * (static_cast<size_t>(kRows) * TileStride(d) +
                          static_cast<size_t>(kTile) * TileStride(d) +
                          static_cast<size_t>(kTile) * 16 * acc) +
         sizeof(double) * 2 * kRows * kTile;
}

/// One CTA = (16 rows, one token segment, one KV head): online-softmax partials in fp64.
template <typename T, int ACC>
__global__ void __launch_bounds__(kThreads) SegmentKernel(SegmentArgs a) {
  extern __shared__ double smem_d[];
  double* ef = smem_d;                               // [16][64] e of the full softmax
  double* ek = ef + kRows * kTile;                   // [16][64] e of the kept softmax
  float* qs = reinterpret_cast<float*>(ek + kRows * kTile);  // [16][TileStride(d)]
  const int ts = TileStride(a.d);
  float* kt = qs + kRows * ts;                       // [64][ts]
  float* vt = kt + kTile * ts;                       // [64][16 * ACC]
  __shared__ uint8_t keep[kTile];
  __shared__ double red[kThreads / 32][4][2];
  __shared__ double run_max[kRows][2];
  __shared__ double factor[kRows][2];
  __shared__ int64_t visible[kRows];

  const T* __restrict__ keys = static_cast<const T*>(a.keys);
  const T* __restrict__ values = static_cast<const T*>(a.values);
  const T* __restrict__ queries = static_cast<const T*>(a.queries);
  const int h = blockIdx.z;
  const int64_t seg = blockIdx.y;
  const int r0 = blockIdx.x * kRows;
  const int tid = threadIdx.x;
  const int64_t seg_lo = seg * a.seg_tokens;
  const int64_t seg_hi = min(seg_lo + a.seg_tokens, a.n);
  const uint8_t* mask = a.mask + (a.shared_list ? 0 : static_cast<int64_t>(h) * a.n);
  constexpr int VW = 16 * ACC;  // v tile width

  for (int idx = tid; idx < kRows * ts; idx += kThreads) {
    const int rr = idx / ts;
    const int i = idx % ts;
    const int r = r0 + rr;
    float v = 0.0f;
    if (r < a.rows && i < a.d) {
      const int64_t qh = static_cast<int64_t>(h) * a.group + r / a.w;
      v = ToF32(queries[(qh * a.w + r % a.w) * a.d + i]);
    }
    qs[idx] = v;
  }
  if (tid < kRows) {
    const int r = r0 + tid;
    visible[tid] = r < a.rows ? VisibleCount(a.n, a.w, r % a.w) : 0;
    run_max[tid][0] = -INFINITY;
    run_max[tid][1] = -INFINITY;
  }

  // Accumulation role: row ar, dims dsub + 16k.
  const int ar = tid / 16;
  const int dsub = tid % 16;
  double acc_full[ACC], acc_kept[ACC];
#pragma unroll
  for (int k = 0; k < ACC; ++k) acc_full[k] = acc_kept[k] = 0.0;
  double sum_full = 0.0, sum_kept = 0.0;
  // Logit role: token lj, rows 4 * lq .. 4 * lq + 3.
  const int lj = tid % kTile;
  const int lq = tid / kTile;

  for (int64_t tile_lo = seg_lo; tile_lo < seg_hi; tile_lo += kTile) {
    __syncthreads();
    for (int idx = tid; idx < kTile * ts; idx += kThreads) {
      const int jj = idx / ts;
      const int i = idx % ts;
      const int64_t j = tile_lo + jj;
      kt[idx] = (j < seg_hi && i < a.d) ? ToF32(keys[(static_cast<int64_t>(h) * a.n + j) * a.d + i])
                                        : 0.0f;
    }
    for (int idx = tid; idx < kTile * VW; idx += kThreads) {
      const int jj = idx / VW;
      const int i = idx % VW;
      const int64_t j = tile_lo + jj;
      vt[idx] = (j < seg_hi && i < a.d)
                    ? ToF32(values[(static_cast<int64_t>(h) * a.n + j) * a.d + i])
                    : 0.0f;
    }
    if (tid < kTile) keep[tid] = tile_lo + tid < seg_hi ? mask[tile_lo + tid] : 0;
    __syncthreads();

    // Logits of 4 rows for token lj (fp64 products of fp32 values are exact).
    double logit[4];
    double dot[4] = {0.0, 0.0, 0.0, 0.0};
    const float4* k4 = reinterpret_cast<const float4*>(kt + lj * ts);
    for (int i4 = 0; i4 < (a.d + 3) / 4; ++i4) {
      const float4 k = k4[i4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float4 q = reinterpret_cast<const float4*>(qs + (4 * lq + u) * ts)[i4];
        dot[u] += static_cast<double>(q.x) * k.x + static_cast<double>(q.y) * k.y +
                  static_cast<double>(q.z) * k.z + static_cast<double>(q.w) * k.w;
      }
    }
    const int64_t j = tile_lo + lj;
    double tmax[4][2];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool seen = j < seg_hi && j < visible[4 * lq + u];
      logit[u] = seen ? a.scale * dot[u] : -INFINITY;
      tmax[u][0] = logit[u];
      tmax[u][1] = seen && keep[lj] ? logit[u] : -INFINITY;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        tmax[u][0] = fmax(tmax[u][0], __shfl_xor_sync(0xffffffffu, tmax[u][0], off));
        tmax[u][1] = fmax(tmax[u][1], __shfl_xor_sync(0xffffffffu, tmax[u][1], off));
      }
    }
    if (tid % 32 == 0) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        red[tid / 32][u][0] = tmax[u][0];
        red[tid / 32][u][1] = tmax[u][1];
      }
    }
    __syncthreads();
    if (tid < 2 * kRows) {
      const int rr = tid / 2;
      const int which = tid % 2;
      // Rows 4q..4q+3 were reduced by warps 2q and 2q + 1 (64 tokens = 2 warps).
      const int q = rr / 4;
      const double tile_max = fmax(red[2 * q][rr % 4][which], red[2 * q + 1][rr % 4][which]);
      const double old_max = run_max[rr][which];
      const double new_max = fmax(old_max, tile_max);
      factor[rr][which] = old_max == -INFINITY ? 1.0 : exp(old_max - new_max);
      run_max[rr][which] = new_max;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int rr = 4 * lq + u;
      const bool seen = logit[u] != -INFINITY;
      ef[rr * kTile + lj] = seen ? exp(logit[u] - run_max[rr][0]) : 0.0;
      ek[rr * kTile + lj] = seen && keep[lj] ? exp(logit[u] - run_max[rr][1]) : 0.0;
    }
    __syncthreads();

    const double f_full = factor[ar][0];
    const double f_kept = factor[ar][1];
    sum_full *= f_full;
    sum_kept *= f_kept;
#pragma unroll
    for (int k = 0; k < ACC; ++k) {
      acc_full[k] *= f_full;
      acc_kept[k] *= f_kept;
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const double e1 = ef[ar * kTile + jj];
      const double e2 = ek[ar * kTile + jj];
      sum_full += e1;
      sum_kept += e2;
#pragma unroll
      for (int k = 0; k < ACC; ++k) {
        const double v = vt[jj * VW + dsub + 16 * k];
        acc_full[k] += e1 * v;
        acc_kept[k] += e2 * v;
      }
    }
  }

  const int r = r0 + ar;
  if (r >= a.rows) return;
  double* out = a.partials + ((static_cast<int64_t>(h) * a.rows + r) * a.segments + seg) *
                                 (2 * static_cast<int64_t>(a.d) + 4);
  if (dsub == 0) {
    out[0] = run_max[ar][0];
    out[1] = sum_full;
    out[2] = run_max[ar][1];
    out[3] = sum_kept;
  }
#pragma unroll
  for (int k = 0; k < ACC; ++k) {
    const int i = dsub + 16 * k;
    if (i < a.d) {
      out[4 + i] = acc_full[k];
      out[4 + a.d + i] = acc_kept[k];
    }
  }
}

/// Deterministic block sum of `v` over kCombineThreads threads (every thread gets it).
__device__ double BlockSum(double v, double* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0.0;
  for (int k = 0; k < kCombineThreads / 32; ++k) s += red[k];
  return s;
}

/// One CTA per row: merges the segment partials and writes the row's relative perturbation.
__global__ void __launch_bounds__(kCombineThreads)
    CombineKernel(const double* partials, int64_t segments, int32_t rows, int32_t d,
                  double* values) {
  __shared__ double red[kCombineThreads / 32];
  __shared__ double s_max[2];
  __shared__ double s_sum[2];
  const int r = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t width = 2 * static_cast<int64_t>(d) + 4;
  const double* base = partials + (static_cast<int64_t>(h) * rows + r) * segments * width;
  if (threadIdx.x < 2) {
    const int which = threadIdx.x;
    double m = -INFINITY;
    for (int64_t s = 0; s < segments; ++s) m = fmax(m, base[s * width + 2 * which]);
    double sum = 0.0;
    if (m != -INFINITY) {
      for (int64_t s = 0; s < segments; ++s) {
        const double ms = base[s * width + 2 * which];
        if (ms != -INFINITY) sum += base[s * width + 2 * which + 1] * exp(ms - m);
      }
    }
    s_max[which] = m;
    s_sum[which] = sum;
  }
  __syncthreads();
  double full_sq = 0.0, kept_sq = 0.0, diff_sq = 0.0;
  for (int i = threadIdx.x; i < d; i += kCombineThreads) {
    double acc[2] = {0.0, 0.0};
    for (int which = 0; which < 2; ++which) {
      if (s_max[which] == -INFINITY) continue;
      for (int64_t s = 0; s < segments; ++s) {
        const double ms = base[s * width + 2 * which];
        if (ms != -INFINITY) acc[which] += base[s * width + 4 + which * d + i] * exp(ms - s_max[which]);
      }
    }
    const double a_full = s_sum[0] > 0 ? acc[0] / s_sum[0] : 0.0;
    const double a_kept = s_sum[1] > 0 ? acc[1] / s_sum[1] : 0.0;
    full_sq += a_full * a_full;
    kept_sq += a_kept * a_kept;
    diff_sq += (a_kept - a_full) * (a_kept - a_full);
  }
  full_sq = BlockSum(full_sq, red);
  kept_sq = BlockSum(kept_sq, red);
  diff_sq = BlockSum(diff_sq, red);
  if (threadIdx.x == 0) {
    double v;
    if (full_sq == 0) {
      v = kept_sq == 0 ? 0.0 : 1.0;
    } else {
      v = sqrt(diff_sq / full_sq);
    }
    values[static_cast<int64_t>(h) * rows + r] = v;
  }
}

/// One thread per KV head: the mean of its R row values, in row order.
__global__ void MeanKernel(const double* values, int32_t num_kv, int32_t rows, double* out) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= num_kv) return;
  double total = 0.0;
  for (int r = 0; r < rows; ++r) total += values[static_cast<int64_t>(h) * rows + r];
  out[h] = total / static_cast<double>(rows);
}

/// Fills out[0..count) with zeros (the CPU's answer when values or queries are absent).
__global__ void ZeroKernel(double* out, int32_t count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = 0.0;
}

/// Launches the segment kernel for element type T.
template <typename T>
cudaError_t LaunchSegments(const PerturbPlan& plan, const SegmentArgs& args, cudaStream_t stream) {
  const dim3 grid(plan.row_blocks, static_cast<unsigned>(plan.segments), plan.num_kv);
  const size_t smem = SegmentSmemBytes(plan.d, plan.acc_per_thread);
  auto launch = [&](auto kernel) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    kernel<<<grid, kThreads, smem, stream>>>(args);
    return cudaGetLastError();
  };
  switch (plan.acc_per_thread) {
    case 4: return launch(SegmentKernel<T, 4>);
    case 8: return launch(SegmentKernel<T, 8>);
    default: return launch(SegmentKernel<T, 16>);
  }
}

}  // namespace

cudaError_t LaunchKeptMask(const int64_t* offsets, const int32_t* indices, int32_t num_lists,
                           int64_t n, uint8_t* mask, cudaStream_t stream) {
  if (num_lists < 1 || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (offsets == nullptr || mask == nullptr) return cudaErrorInvalidValue;
  BuildMaskKernel<<<num_lists, 256, 0, stream>>>(offsets, indices, n, mask);
  return cudaGetLastError();
}

size_t PerturbationScratchBytes(const DeviceLayer& layer) {
  PerturbPlan plan;
  // Room for one list per KV head (a shared list needs less).
  if (!MakePlan(layer, layer.num_kv_heads, &plan)) return 0;
  return plan.bytes;
}

cudaError_t LaunchPerturbation(const DeviceLayer& layer, const int64_t* offsets, int32_t num_lists,
                               const int32_t* indices, double* out, void* scratch,
                               size_t scratch_bytes, cudaStream_t stream) {
  if (out == nullptr || layer.num_kv_heads < 0) return cudaErrorInvalidValue;
  if (layer.num_kv_heads == 0) return cudaSuccess;
  if (layer.values == nullptr || layer.queries == nullptr || layer.window_rows < 1 ||
      layer.num_query_heads < 1 || num_lists < 1) {
    ZeroKernel<<<(layer.num_kv_heads + 127) / 128, 128, 0, stream>>>(out, layer.num_kv_heads);
    return cudaGetLastError();
  }
  if (num_lists != 1 && num_lists != layer.num_kv_heads) return cudaErrorInvalidValue;
  if (offsets == nullptr || layer.keys == nullptr) return cudaErrorInvalidValue;
  PerturbPlan plan;
  if (!MakePlan(layer, layer.num_kv_heads, &plan)) return cudaErrorInvalidValue;
  if (scratch == nullptr || scratch_bytes < plan.bytes) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  uint8_t* mask = reinterpret_cast<uint8_t*>(base + plan.mask_offset);
  double* partials = reinterpret_cast<double*>(base + plan.partial_offset);
  double* row_values = reinterpret_cast<double*>(base + plan.value_offset);

  if (plan.n > 0) {
    cudaError_t err = LaunchKeptMask(offsets, indices, num_lists, plan.n, mask, stream);
    if (err != cudaSuccess) return err;
    SegmentArgs args;
    args.keys = layer.keys;
    args.values = layer.values;
    args.queries = layer.queries;
    args.mask = mask;
    args.shared_list = num_lists == 1;
    args.n = plan.n;
    args.seg_tokens = plan.seg_tokens;
    args.segments = plan.segments;
    args.d = plan.d;
    args.w = plan.w;
    args.rows = plan.rows;
    args.group = plan.group;
    args.scale = static_cast<double>(layer.softmax_scale);
    args.partials = partials;
    switch (layer.dtype) {
      case DType::kF16: err = LaunchSegments<__half>(plan, args, stream); break;
      case DType::kBF16: err = LaunchSegments<__nv_bfloat16>(plan, args, stream); break;
      case DType::kF32:
      default: err = LaunchSegments<float>(plan, args, stream); break;
    }
    if (err != cudaSuccess) return err;
    CombineKernel<<<dim3(plan.rows, plan.num_kv), kCombineThreads, 0, stream>>>(
        partials, plan.segments, plan.rows, plan.d, row_values);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  } else {
    // n = 0: every row sees nothing and contributes 0.
    cudaError_t err = cudaMemsetAsync(row_values, 0,
                                      static_cast<size_t>(plan.num_kv) * plan.rows * sizeof(double),
                                      stream);
    if (err != cudaSuccess) return err;
  }
  MeanKernel<<<(plan.num_kv + 127) / 128, 128, 0, stream>>>(row_values, plan.num_kv, plan.rows, out);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
