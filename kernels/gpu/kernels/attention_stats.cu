// Canonical row statistics on the GPU (attention_stats.cuh): steps 1-3 of the definition in
// kernels/cpu/window_attention.h, bit for bit.
#include "kernels/gpu/kernels/attention_stats.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/gpu/kernels/attention_common.cuh"

namespace kvtrim::gpu::attn {

namespace {

constexpr int kStatsRows = 16;       // rows per CTA of the segment kernel
constexpr int kStatsThreads = 256;   // 32 token groups of 8 lanes
constexpr int kTokenGroups = kStatsThreads / kLanes;
constexpr int kSeg = static_cast<int>(kAttnSegment);
constexpr int kChunk = static_cast<int>(kAttnChunk);
constexpr int kChunksPerSeg = kAttnChunksPerSegment;
constexpr int kLogitStride = kSeg + 4;  // floats per logit row: 16-byte rows, 4-bank skew
constexpr int kCombineThreads = 128;
constexpr int kCombineLevels = 24;      // tree levels of the combine: up to 2^24 - 1 segments
static_assert(kChunksPerSeg <= 15, "the chunk tree below holds 4 levels");

/// Arguments of both statistics kernels (device pointers into the layer and the scratch).
struct StatsArgs {
  const void* keys;     // [H_kv, n, d] T
  const void* values;   // [H_kv, n, d] T (with_output)
  const void* queries;  // [H_q, w, d] T
  int64_t n;
  int32_t d, w, rows, rows_per_qhead, first_row, group;
  float scale;
  int64_t num_segments;
  float* seg_max;       // [H_kv, R, segments]
  float* seg_sum;       // [H_kv, R, segments]
  float* seg_out;       // [H_kv, R, segments, d] (with_output)
  RowStats* row_stats;  // [H_kv, R]
  float* row_out;       // [H_kv, R, d] (with_output)
};

/// Dynamic shared memory of the segment kernel: per-lane queries [16, 8, QS], logits
/// [16, kLogitStride], chunk sums [8, 16] and (with outputs) one V chunk [64, 8E].
template <int E, bool kOut>
constexpr size_t SegmentSmemBytes() {
  return sizeof(float) * (static_cast<size_t>(kStatsRows) * kLanes * LaneStride(E) +
                          static_cast<size_t>(kStatsRows) * kLogitStride +
                          static_cast<size_t>(kStatsRows) * kChunksPerSeg +
                          (kOut ? static_cast<size_t>(kChunk) * kLanes * E : 0));
}

/// One CTA = (16 rows, one 512-token segment, one KV head). Writes m_s and z_s (and o_s)
/// of every row that sees at least one token of the segment (canonical step 2).
template <typename T, int E, bool kOut>
__global__ void __launch_bounds__(kStatsThreads) SegmentPartialsKernel(StatsArgs a) {
  constexpr int QS = LaneStride(E);
  constexpr int DP = kLanes * E;  // padded head dim
  extern __shared__ float4 smem4[];
  float* qp = reinterpret_cast<float*>(smem4);     // [16][8][QS] per-lane query vectors
  float* lg = qp + kStatsRows * kLanes * QS;       // [16][kLogitStride] logits, then e_j
  float* zc = lg + kStatsRows * kLogitStride;      // [8 chunks][16 rows] z_c
  float* vt = zc + kStatsRows * kChunksPerSeg;     // [64][DP] one V chunk (kOut)
  __shared__ int cnt[kStatsRows];                  // tokens of each row in this segment
  __shared__ float smax[kStatsRows];               // m_s

  const T* __restrict__ keys = static_cast<const T*>(a.keys);
  const T* __restrict__ queries = static_cast<const T*>(a.queries);
  const int h = blockIdx.z;
  const int64_t seg = blockIdx.y;
  const int r0 = blockIdx.x * kStatsRows;
  const int64_t lo = seg * kSeg;
  const int tid = threadIdx.x;

  if (tid < kStatsRows) {
    const int r = r0 + tid;
    int c = 0;
    if (r < a.rows) {
      const int64_t rem =
          VisibleCount(a.n, a.w, a.first_row + r % a.rows_per_qhead) - lo;
      c = rem <= 0 ? 0 : (rem >= kSeg ? kSeg : static_cast<int>(rem));
    }
    cnt[tid] = c;
  }
  for (int idx = tid; idx < kStatsRows * DP; idx += kStatsThreads) {
    const int rr = idx / DP;
    const int lane = (idx % DP) / E;
    const int m = idx % E;
    const int i = lane + kLanes * m;
    const int r = r0 + rr;
    float v = 0.0f;
    if (r < a.rows && i < a.d) {
      const int64_t qh = static_cast<int64_t>(h) * a.group + r / a.rows_per_qhead;
      const int64_t t = a.first_row + r % a.rows_per_qhead;
      v = ToF32(queries[(qh * a.w + t) * a.d + i]);
    }
    qp[(rr * kLanes + lane) * QS + m] = v;
  }
  __syncthreads();
  int cta_tokens = 0;
  for (int rr = 0; rr < kStatsRows; ++rr) cta_tokens = max(cta_tokens, cnt[rr]);
  if (cta_tokens == 0) return;  // uniform: no row sees this segment

  // Phase 1: logits l_j = CmMul(CmDot(q, k_j), scale); a token group of 8 threads holds the
  // keys of TJ tokens and forms 8 rows' dot products at a time (Butterfly8).
  constexpr int TJ = E <= 16 ? 2 : 1;
  const int lane = LaneOfThread(tid);
  const int tg = GroupOfThread(tid);
  const int row_groups = (min(kStatsRows, a.rows - r0) + 7) / 8;
  for (int base = 0; base < cta_tokens; base += kTokenGroups * TJ) {
    float kr[TJ][E];
#pragma unroll
    for (int u = 0; u < TJ; ++u) {
      const int jj = base + tg + kTokenGroups * u;
      if (jj < cta_tokens) {
        LoadLaneVector<E>(keys + (static_cast<int64_t>(h) * a.n + lo + jj) * a.d, a.d, lane,
                          kr[u]);
      } else {
#pragma unroll
        for (int m = 0; m < E; ++m) kr[u][m] = 0.0f;
      }
    }
    for (int rg = 0; rg < row_groups; ++rg) {
      float lanes8[TJ][8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float part[TJ];
        LanePartials<E, TJ>(kr, qp + ((rg * 8 + k) * kLanes + lane) * QS, part);
#pragma unroll
        for (int u = 0; u < TJ; ++u) lanes8[u][k] = part[u];
      }
      const int rr = rg * 8 + ButterflyRow(lane);
#pragma unroll
      for (int u = 0; u < TJ; ++u) {
        const float dot = Butterfly8(lanes8[u], lane);
        const int jj = base + tg + kTokenGroups * u;
        if (jj < cnt[rr]) lg[rr * kLogitStride + jj] = CmMul(dot, a.scale);
      }
    }
  }
  __syncthreads();

  // Phase 2: segment maximum m_s and e_j = CmExp(l_j - m_s); zero up to the chunk end.
  const int warp = tid / 32;
  const int wl = tid % 32;
  for (int rr = warp; rr < kStatsRows; rr += kStatsThreads / 32) {
    const int c = cnt[rr];
    if (c == 0) continue;  // warp-uniform
    float* row = lg + rr * kLogitStride;
    float m = -INFINITY;
    for (int jj = wl; jj < c; jj += 32) m = fmaxf(m, row[jj]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    const int padded = (c + kChunk - 1) / kChunk * kChunk;
    for (int jj = wl; jj < padded; jj += 32) {
      row[jj] = jj < c ? CmExp(CmAdd(row[jj], -m)) : 0.0f;
    }
    if (wl == 0) smax[rr] = m;
  }
  __syncthreads();

  // Phase 3: chunk sums z_c (sequential; the zero padding adds nothing), then z_s (tree).
  if (tid < kStatsRows * kChunksPerSeg) {
    const int rr = tid % kStatsRows;
    const int c = tid / kStatsRows;
    const int len = cnt[rr] - c * kChunk;
    if (len > 0) {
      const float4* e4 = reinterpret_cast<const float4*>(lg + rr * kLogitStride + c * kChunk);
      float z = 0.0f;
      for (int k = 0; k < (min(len, kChunk) + 3) / 4; ++k) {
        const float4 e = e4[k];
        z = CmAdd(z, e.x);
        z = CmAdd(z, e.y);
        z = CmAdd(z, e.z);
        z = CmAdd(z, e.w);
      }
      zc[c * kStatsRows + rr] = z;
    }
  }
  __syncthreads();
  if (tid < kStatsRows && cnt[tid] > 0) {
    TreeAccumulator<4> tree;
    for (int c = 0; c * kChunk < cnt[tid]; ++c) tree.Push(zc[c * kStatsRows + tid]);
    const int64_t cell = (static_cast<int64_t>(h) * a.rows + r0 + tid) * a.num_segments + seg;
    a.seg_max[cell] = smax[tid];
    a.seg_sum[cell] = tree.Sum();
  }

  // Phase 4: chunk outputs o_c[i] = seq_j CmMul(e_j, v_j[i]), then o_s (tree over chunks).
  if constexpr (kOut) {
    constexpr int QD = DP / 4;                                  // float4 quads per row
    constexpr int QPT = QD / (kStatsThreads / kStatsRows);      // quads per thread
    static_assert(QPT >= 1 && QD % (kStatsThreads / kStatsRows) == 0, "quad split");
    const T* __restrict__ values = static_cast<const T*>(a.values);
    const T* vbase = values + (static_cast<int64_t>(h) * a.n + lo) * a.d;
    const int rr = tid % kStatsRows;
    const int q0 = (tid / kStatsRows) * QPT;
    const int cr = cnt[rr];
    const float4* vt4 = reinterpret_cast<const float4*>(vt);
    TreeAccumulator<4> tree[QPT][4];
    const int cta_chunks = (cta_tokens + kChunk - 1) / kChunk;
    for (int c = 0; c < cta_chunks; ++c) {
      __syncthreads();  // the previous chunk's readers are done with vt
      for (int idx = tid; idx < kChunk * DP; idx += kStatsThreads) {
        const int jj = idx / DP;
        const int i = idx % DP;
        const int tok = c * kChunk + jj;
        vt[idx] = (tok < cta_tokens && i < a.d) ? ToF32(vbase[static_cast<int64_t>(tok) * a.d + i])
                                                : 0.0f;
      }
      __syncthreads();
      if (c * kChunk < cr) {
        float4 acc[QPT];
#pragma unroll
        for (int q = 0; q < QPT; ++q) acc[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4* e4 = reinterpret_cast<const float4*>(lg + rr * kLogitStride + c * kChunk);
        for (int k = 0; k < kChunk / 4; ++k) {
          const float4 e = e4[k];
          const float es[4] = {e.x, e.y, e.z, e.w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
#pragma unroll
            for (int q = 0; q < QPT; ++q) {
              const float4 v = vt4[(4 * k + u) * QD + q0 + q];
              acc[q].x = CmAdd(acc[q].x, CmMul(es[u], v.x));
              acc[q].y = CmAdd(acc[q].y, CmMul(es[u], v.y));
              acc[q].z = CmAdd(acc[q].z, CmMul(es[u], v.z));
              acc[q].w = CmAdd(acc[q].w, CmMul(es[u], v.w));
            }
          }
        }
#pragma unroll
        for (int q = 0; q < QPT; ++q) {
          tree[q][0].Push(acc[q].x);
          tree[q][1].Push(acc[q].y);
          tree[q][2].Push(acc[q].z);
          tree[q][3].Push(acc[q].w);
        }
      }
    }
    if (cr > 0) {
      const int64_t cell = (static_cast<int64_t>(h) * a.rows + r0 + rr) * a.num_segments + seg;
      float* out = a.seg_out + cell * a.d;
#pragma unroll
      for (int q = 0; q < QPT; ++q) {
#pragma unroll
        for (int comp = 0; comp < 4; ++comp) {
          const int i = (q0 + q) * 4 + comp;
          if (i < a.d) out[i] = tree[q][comp].Sum();
        }
      }
    }
  }
}

/// Block-wide maximum of `v` over kCombineThreads threads (every thread gets it).
__device__ float BlockMax(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float m = red[0];
  for (int k = 1; k < kCombineThreads / 32; ++k) m = fmaxf(m, red[k]);
  return m;
}

/// One CTA = one row: M, Z and (with outputs) a, |a|^2 from the segment partials (step 3).
__global__ void __launch_bounds__(kCombineThreads) CombineRowsKernel(StatsArgs a, bool with_output) {
  __shared__ float red[kCombineThreads / 32];
  __shared__ float s_sum;
  __shared__ float s_out[kMaxHeadDim];
  const int r = blockIdx.x;
  const int h = blockIdx.y;
  const int tid = threadIdx.x;
  const int64_t row = static_cast<int64_t>(h) * a.rows + r;
  const int64_t visible = VisibleCount(a.n, a.w, a.first_row + r % a.rows_per_qhead);
  if (visible == 0) {
    if (with_output) {
      for (int i = tid; i < a.d; i += kCombineThreads) a.row_out[row * a.d + i] = 0.0f;
    }
    if (tid == 0) a.row_stats[row] = RowStats{0.0f, 0.0f, 0.0f, 0};
    return;
  }
  const int64_t segs = (visible + kSeg - 1) / kSeg;
  const int64_t cell0 = row * a.num_segments;
  float m = -INFINITY;
  for (int64_t s = tid; s < segs; s += kCombineThreads) m = fmaxf(m, a.seg_max[cell0 + s]);
  const float max_logit = BlockMax(m, red);
  if (tid == 0) {
    TreeAccumulator<kCombineLevels> tree;
    for (int64_t s = 0; s < segs; ++s) {
      const float f = CmExp(CmAdd(a.seg_max[cell0 + s], -max_logit));
      tree.Push(CmMul(a.seg_sum[cell0 + s], f));
    }
    s_sum = tree.Sum();
  }
  __syncthreads();
  const float sum = s_sum;
  float out_sq = 0.0f;
  if (with_output) {
    for (int i = tid; i < a.d; i += kCombineThreads) {
      TreeAccumulator<kCombineLevels> tree;
      for (int64_t s = 0; s < segs; ++s) {
        const float f = CmExp(CmAdd(a.seg_max[cell0 + s], -max_logit));
        tree.Push(CmMul(a.seg_out[(cell0 + s) * a.d + i], f));
      }
      const float ai = CmDiv(tree.Sum(), sum);
      s_out[i] = ai;
      a.row_out[row * a.d + i] = ai;
    }
    __syncthreads();
    if (tid == 0) out_sq = CmDot(s_out, s_out, a.d);
  }
  if (tid == 0) {
    a.row_stats[row] = RowStats{-max_logit, CmDiv(1.0f, sum), out_sq, static_cast<int32_t>(visible)};
  }
}

/// Launches both kernels for element type T and E elements per lane.
template <typename T, int E>
cudaError_t LaunchTyped(const AttentionPlan& plan, const StatsArgs& args, cudaStream_t stream) {
  const dim3 grid1((plan.rows_per_head + kStatsRows - 1) / kStatsRows,
                   static_cast<unsigned>(plan.num_segments), plan.num_kv_heads);
  cudaError_t err;
  if (plan.with_output) {
    auto* kernel = SegmentPartialsKernel<T, E, true>;
    constexpr size_t smem = SegmentSmemBytes<E, true>();
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<grid1, kStatsThreads, smem, stream>>>(args);
  } else {
    auto* kernel = SegmentPartialsKernel<T, E, false>;
    constexpr size_t smem = SegmentSmemBytes<E, false>();
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<grid1, kStatsThreads, smem, stream>>>(args);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 grid2(plan.rows_per_head, plan.num_kv_heads);
  CombineRowsKernel<<<grid2, kCombineThreads, 0, stream>>>(args, plan.with_output);
  return cudaGetLastError();
}

/// Picks E for element type T.
template <typename T>
cudaError_t LaunchForType(const AttentionPlan& plan, const StatsArgs& args, cudaStream_t stream) {
  switch (plan.lane_elems) {
    case 8: return LaunchTyped<T, 8>(plan, args, stream);
    case 16: return LaunchTyped<T, 16>(plan, args, stream);
    case 32: return LaunchTyped<T, 32>(plan, args, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchAttentionStats(const AttentionPlan& plan, const DeviceLayer& layer,
                                 void* scratch, cudaStream_t stream) {
  if (plan.num_tokens == 0 || plan.rows_per_head == 0 || plan.num_kv_heads == 0) {
    return cudaSuccess;
  }
  if (plan.num_segments > 65535) return cudaErrorInvalidValue;  // grid.y limit
  char* base = static_cast<char*>(scratch);
  StatsArgs args;
  args.keys = layer.keys;
  args.values = layer.values;
  args.queries = layer.queries;
  args.n = plan.num_tokens;
  args.d = plan.head_dim;
  args.w = plan.window_rows;
  args.rows = plan.rows_per_head;
  args.rows_per_qhead = plan.rows_per_qhead;
  args.first_row = plan.first_row;
  args.group = plan.group;
  args.scale = layer.softmax_scale;
  args.num_segments = plan.num_segments;
  args.seg_max = reinterpret_cast<float*>(base + plan.seg_max_offset);
  args.seg_sum = reinterpret_cast<float*>(base + plan.seg_sum_offset);
  args.seg_out = reinterpret_cast<float*>(base + plan.seg_out_offset);
  args.row_stats = reinterpret_cast<RowStats*>(base + plan.row_stats_offset);
  args.row_out = reinterpret_cast<float*>(base + plan.row_out_offset);
  switch (layer.dtype) {
    case DType::kF32: return LaunchForType<float>(plan, args, stream);
    case DType::kF16: return LaunchForType<__half>(plan, args, stream);
    case DType::kBF16: return LaunchForType<__nv_bfloat16>(plan, args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtrim::gpu::attn
