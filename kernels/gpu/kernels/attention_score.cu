// Canonical per-token score accumulation on the GPU (attention_score.cuh): steps 4-5 of
// kernels/cpu/window_attention.h, bit for bit.
#include "kernels/gpu/kernels/attention_score.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/gpu/kernels/attention_common.cuh"

namespace kvtrim::gpu::attn {

namespace {

constexpr int kScoreThreads = 256;                   // 32 token groups of 8 lanes
constexpr int kTokenGroups = kScoreThreads / kLanes;
constexpr int kScoreRows = 32;                       // rows staged in shared memory at once


/// Arguments of the score kernel (device pointers into the layer and the scratch).
struct ScoreArgs {
  const void* keys;     // [H_kv, n, d] T
  const void* values;   // [H_kv, n, d] T (DropKV)
  const void* queries;  // [H_q, w, d] T
  int64_t n;
  int32_t d, w, rows, padded_rows, rows_per_qhead, first_row, group, num_kv_heads;
  float scale;
  float eps;            // DropKV
  bool bf16_round;      // DropKV
  WindowNormalize finish;
  Reduce reduce;              // kSum unless a model-aware scorer (plain variant only)
  const RowStats* row_stats;  // [H_kv, R]
  const float* row_out;       // [H_kv, R, d] (DropKV)
  float* out;                 // [H_kv, n]
};

/// Dynamic shared memory: per-lane query vectors [32, 8, QS] and (DropKV) outputs likewise.
template <int E, bool kDrop>
constexpr size_t ScoreSmemBytes() {
  return sizeof(float) * static_cast<size_t>(kScoreRows) * kLanes * LaneStride(E) * (kDrop ? 2 : 1);
}

/// The score of a token from its row sum (canonical step 5).
__device__ __forceinline__ float FinishScore(const ScoreArgs& a, float acc, int64_t j) {
  switch (a.finish) {
    case WindowNormalize::kRowMean:
      return CmDiv(acc, static_cast<float>(static_cast<int64_t>(a.group) * a.rows_per_qhead));
    case WindowNormalize::kVisibleRowMean: {
      const int64_t first = max(static_cast<int64_t>(0), j - (a.n - a.w));
      const int64_t rows = max(static_cast<int64_t>(0), static_cast<int64_t>(a.w) - first);
      return rows > 0 ? CmDiv(acc, static_cast<float>(a.group * rows)) : 0.0f;
    }
    case WindowNormalize::kEveryHeadMean:
      return CmDiv(acc, static_cast<float>(static_cast<int64_t>(a.group) * a.num_kv_heads));
    case WindowNormalize::kGroupMean:
    default:
      return CmDiv(acc, static_cast<float>(a.group));
  }
}

/// The physical row (g * T + t order of the statistics) of logical row r: the identity but
/// for kGroupSq, whose logical rows run t-major (r = t * G + g).
__device__ __forceinline__ int PhysicalRow(const ScoreArgs& a, int r) {
  return a.reduce == Reduce::kGroupSq ? (r % a.group) * a.rows_per_qhead + r / a.group : r;
}

/// One CTA = 32 * TJ tokens of one KV head (kAllHeads: of every KV head in turn, TOVA).
/// Token group g (8 lanes) owns tokens tok0 + g + 32u, u < TJ, holds their keys (and values)
/// in registers, and walks the rows in order: 8 rows at a time it forms the 8 dot products
/// with Butterfly8, the lane of each row computes that row's term, and the 8 terms are
/// added to the token's sum in row order.
///
/// a.reduce != kSum (model-aware scorers; the plain variant only, a runtime field so that they
/// add no kernel instantiations): the same walk, but the sum is cut per query head (kPerQMean,
/// kPerQSq: flushed to out [H_q, n] after the last row of each query head) or walked t-major
/// with the group sum squared per row (kGroupSq: logical row r' = t * G + g reads the physical
/// row g * T + t).
template <typename T, int E, int TJ, bool kDrop, bool kAllHeads>
__global__ void __launch_bounds__(kScoreThreads, 2) ScoreKernel(ScoreArgs a) {
  constexpr bool kPlain = !kDrop && !kAllHeads;
  const Reduce reduce = kPlain ? a.reduce : Reduce::kSum;
  constexpr int QS = LaneStride(E);
  extern __shared__ float4 smem4[];
  float* qp = reinterpret_cast<float*>(smem4);     // [32][8][QS] per-lane queries
  float* ap = qp + kScoreRows * kLanes * QS;       // [32][8][QS] per-lane outputs (kDrop)
  __shared__ RowStats rs[kScoreRows];

  const T* __restrict__ keys = static_cast<const T*>(a.keys);
  const T* __restrict__ values = static_cast<const T*>(a.values);
  const T* __restrict__ queries = static_cast<const T*>(a.queries);
  const int tid = threadIdx.x;
  const int lane = LaneOfThread(tid);
  const int tg = GroupOfThread(tid);
  const int warp_lane = tid % 32;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.x) * (kTokenGroups * TJ);
  const int head_lo = kAllHeads ? 0 : static_cast<int>(blockIdx.y);
  const int head_hi = kAllHeads ? a.num_kv_heads : head_lo + 1;

  float acc[TJ];
  float col[TJ];  // kGroupSq: seq_t CmMul(m_t, m_t)
#pragma unroll
  for (int u = 0; u < TJ; ++u) {
    acc[u] = 0.0f;
    col[u] = 0.0f;
  }

  for (int h = head_lo; h < head_hi; ++h) {
    float kr[TJ][E];
    float vr[kDrop ? TJ : 1][kDrop ? E : 1];
    float vv[TJ];
#pragma unroll
    for (int u = 0; u < TJ; ++u) {
      const int64_t j = tok0 + tg + kTokenGroups * u;
      const int64_t off = (static_cast<int64_t>(h) * a.n + j) * a.d;
      if (j < a.n) {
        LoadLaneVector<E>(keys + off, a.d, lane, kr[u]);
      } else {
#pragma unroll
        for (int m = 0; m < E; ++m) kr[u][m] = 0.0f;
      }
      vv[u] = 0.0f;
      if constexpr (kDrop) {
        if (j < a.n) {
          LoadLaneVector<E>(values + off, a.d, lane, vr[u]);
        } else {
#pragma unroll
          for (int m = 0; m < E; ++m) vr[u][m] = 0.0f;
        }
        vv[u] = ReduceLanes(LanePartialRegs<E>(vr[u], vr[u]));
      }
    }

    float part[TJ];  // seq sum over this head's rows
#pragma unroll
    for (int u = 0; u < TJ; ++u) part[u] = 0.0f;
    for (int rb = 0; rb < a.padded_rows; rb += kScoreRows) {
      __syncthreads();  // the previous block's readers are done
      for (int idx = tid; idx < kScoreRows * kLanes * E; idx += kScoreThreads) {
        const int rr = idx / (kLanes * E);
        const int ln = (idx / E) % kLanes;
        const int m = idx % E;
        const int i = ln + kLanes * m;
        const int r = kPlain ? PhysicalRow(a, rb + rr) : rb + rr;
        float qv = 0.0f;
        float av = 0.0f;
        if (rb + rr < a.rows && i < a.d) {
          const int64_t qh = static_cast<int64_t>(h) * a.group + r / a.rows_per_qhead;
          const int64_t t = a.first_row + r % a.rows_per_qhead;
          qv = ToF32(queries[(qh * a.w + t) * a.d + i]);
          if constexpr (kDrop) av = a.row_out[(static_cast<int64_t>(h) * a.rows + r) * a.d + i];
        }
        qp[(rr * kLanes + ln) * QS + m] = qv;
        if constexpr (kDrop) ap[(rr * kLanes + ln) * QS + m] = av;
      }
      if (tid < kScoreRows) {
        const int r = rb + tid;
        rs[tid] = r < a.rows
                      ? a.row_stats[static_cast<int64_t>(h) * a.rows + (kPlain ? PhysicalRow(a, r) : r)]
                      : RowStats{0.0f, 0.0f, 0.0f, 0};
      }
      __syncthreads();

      const int groups = min(kScoreRows, a.padded_rows - rb) / 8;
      for (int rg = 0; rg < groups; ++rg) {
        const int rr = rg * 8 + ButterflyRow(lane);
        const RowStats st = rs[rr];
        // Lane partials of the 8 rows' logits (and outputs) for the TJ tokens.
        float dot_lanes[TJ][8];
        float av_lanes[kDrop ? TJ : 1][8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          float part_k[TJ];
          LanePartials<E, TJ>(kr, qp + ((rg * 8 + k) * kLanes + lane) * QS, part_k);
#pragma unroll
          for (int u = 0; u < TJ; ++u) dot_lanes[u][k] = part_k[u];
          if constexpr (kDrop) {
            LanePartials<E, TJ>(vr, ap + ((rg * 8 + k) * kLanes + lane) * QS, part_k);
#pragma unroll
            for (int u = 0; u < TJ; ++u) av_lanes[u][k] = part_k[u];
          }
        }
#pragma unroll
        for (int u = 0; u < TJ; ++u) {
          const float dot = Butterfly8(dot_lanes[u], lane);
          float av = 0.0f;
          if constexpr (kDrop) av = Butterfly8(av_lanes[u], lane);
          const int64_t j = tok0 + tg + kTokenGroups * u;
          float term = 0.0f;
          if (j < st.visible) {
            float p = CanonicalProb(CmMul(dot, a.scale), st.neg_max, st.inv_sum);
            if constexpr (kDrop) {
              if (a.bf16_round) p = RoundToBf16Device(p);
              term = DropKVTerm(p, a.eps, st.out_sq, vv[u], av);
            } else {
              term = reduce == Reduce::kPerQSq ? CmMul(p, p) : p;
            }
          }
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const float x = __shfl_sync(0xffffffffu, term, WarpLaneOf(ButterflyRow(k), warp_lane));
            if (reduce == Reduce::kSum) {
              part[u] = CmAdd(part[u], x);
            } else {
              const int r = rb + rg * 8 + k;  // logical row (uniform across the warp)
              if (r < a.rows) {
                part[u] = CmAdd(part[u], x);
                if (reduce == Reduce::kGroupSq) {
                  if ((r + 1) % a.group == 0) {  // the group of window row t is complete
                    const float m = CmDiv(part[u], static_cast<float>(a.group));
                    col[u] = CmAdd(col[u], CmMul(m, m));
                    part[u] = 0.0f;
                  }
                } else if ((r + 1) % a.rows_per_qhead == 0) {  // query head r / T is complete
                  const int64_t j = tok0 + tg + kTokenGroups * u;
                  if (lane == 0 && j < a.n) {
                    const int64_t qh = static_cast<int64_t>(h) * a.group + r / a.rows_per_qhead;
                    a.out[qh * a.n + j] =
                        reduce == Reduce::kPerQMean
                            ? CmDiv(part[u], static_cast<float>(a.rows_per_qhead))
                            : CmSqrt(part[u]);
                  }
                  part[u] = 0.0f;
                }
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < TJ; ++u) acc[u] = CmAdd(acc[u], part[u]);
  }

  if (lane != 0) return;
  // kPerQMean / kPerQSq wrote their rows as each query head completed.
  if (reduce == Reduce::kSum || reduce == Reduce::kGroupSq) {
#pragma unroll
    for (int u = 0; u < TJ; ++u) {
      const int64_t j = tok0 + tg + kTokenGroups * u;
      if (j >= a.n) continue;
      if (reduce == Reduce::kGroupSq) {
        a.out[static_cast<int64_t>(blockIdx.y) * a.n + j] = CmSqrt(col[u]);
      } else {
        const float score = FinishScore(a, acc[u], j);
        if (kAllHeads) {
          for (int h = 0; h < a.num_kv_heads; ++h) a.out[static_cast<int64_t>(h) * a.n + j] = score;
        } else {
          a.out[static_cast<int64_t>(blockIdx.y) * a.n + j] = score;
        }
      }
    }
  }
}

/// Launches the score kernel for element type T, E elements per lane and the scorer.
template <typename T, int E, bool kDrop, bool kAllHeads>
cudaError_t LaunchVariant(const AttentionPlan& plan, const ScoreArgs& args, cudaStream_t stream) {
  constexpr int TJ = E <= 16 ? 2 : 1;
  auto* kernel = ScoreKernel<T, E, TJ, kDrop, kAllHeads>;
  constexpr size_t smem = ScoreSmemBytes<E, kDrop>();
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const int64_t tokens_per_cta = static_cast<int64_t>(kTokenGroups) * TJ;
  const dim3 grid(static_cast<unsigned>((plan.num_tokens + tokens_per_cta - 1) / tokens_per_cta),
                  kAllHeads ? 1u : static_cast<unsigned>(plan.num_kv_heads));
  kernel<<<grid, kScoreThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

/// Picks the scorer variant for element type T and E.
template <typename T, int E>
cudaError_t LaunchForE(const AttentionPlan& plan, const ScoreArgs& args, cudaStream_t stream) {
  if (plan.reduce != Reduce::kSum) return LaunchVariant<T, E, false, false>(plan, args, stream);
  if (plan.with_output) return LaunchVariant<T, E, true, false>(plan, args, stream);
  if (plan.all_heads) return LaunchVariant<T, E, false, true>(plan, args, stream);
  return LaunchVariant<T, E, false, false>(plan, args, stream);
}

/// Picks E for element type T.
template <typename T>
cudaError_t LaunchForType(const AttentionPlan& plan, const ScoreArgs& args, cudaStream_t stream) {
  switch (plan.lane_elems) {
    case 8: return LaunchForE<T, 8>(plan, args, stream);
    case 16: return LaunchForE<T, 16>(plan, args, stream);
    case 32: return LaunchForE<T, 32>(plan, args, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchAttentionScores(const AttentionPlan& plan, const DeviceLayer& layer,
                                  const ScorerParams& params, const void* scratch, float* out,
                                  cudaStream_t stream) {
  if (plan.num_tokens == 0 || plan.num_kv_heads == 0) return cudaSuccess;
  if (plan.num_tokens > (int64_t{1} << 36)) return cudaErrorInvalidValue;  // grid.x limit
  const char* base = static_cast<const char*>(scratch);
  ScoreArgs args;
  args.keys = layer.keys;
  args.values = layer.values;
  args.queries = layer.queries;
  args.n = plan.num_tokens;
  args.d = plan.head_dim;
  args.w = plan.window_rows;
  args.rows = plan.rows_per_head;
  args.padded_rows = plan.padded_rows;
  args.rows_per_qhead = plan.rows_per_qhead;
  args.first_row = plan.first_row;
  args.group = plan.group;
  args.num_kv_heads = plan.num_kv_heads;
  args.scale = layer.softmax_scale;
  args.eps = params.eps;
  args.bf16_round = params.bf16_prob_round;
  args.finish = plan.finish;
  args.reduce = plan.reduce;
  args.row_stats = reinterpret_cast<const RowStats*>(base + plan.row_stats_offset);
  args.row_out = reinterpret_cast<const float*>(base + plan.row_out_offset);
  args.out = out;
  switch (layer.dtype) {
    case DType::kF32: return LaunchForType<float>(plan, args, stream);
    case DType::kF16: return LaunchForType<__half>(plan, args, stream);
    case DType::kBF16: return LaunchForType<__nv_bfloat16>(plan, args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtrim::gpu::attn
