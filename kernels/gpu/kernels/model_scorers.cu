// The model-aware scorers on the GPU (LaunchModelScore, launchers.h): CriticalKV, LaProx and
// Expected Attention, bit-identical to the canonical definitions in kernels/cpu/scorers.h
// ("MODEL-AWARE SCORERS") and their CPU code (score_criticalkv.cc, score_laprox.cc,
// score_expected_attention.cc, projected_norms.cc).
//
// Launch sequences (P = n - window; scratch regions of ModelPlan):
//  CriticalKV   LaunchAttentionStats -> LaunchAttentionScores (kPerQMean: mean_q [H_q, n])
//               -> LaunchPool1DStrided over [0, P) -> pooled_q [H_q, n]
//               -> l1: ProjectedL1Kernel, l2: QuadFormKernel (head Gram) -> n_q [H_q, n]
//               -> CriticalCombineKernel -> attention, critical [H_kv, n]
//  LaProx       stats -> scores (mean, summed_wo: kGroupSq -> col [H_kv, n]; head_bound:
//               kPerQSq -> col_q [H_q, n]) -> pooling over [0, P) -> QuadFormKernel (head or
//               group Gram) -> LaProxCombineKernel -> p [H_kv, n]
//  Expected     QuadFormKernel (EA: logits l_{q,j} [H_q, n]) -> EaSoftmaxKernel (-M, 1/Z per
//  Attention    query head) -> EaScoreKernel -> scores [H_kv, n]
//
// ProjectedL1Kernel: ||v W_O^q||_1 = CmChunkedSum_{e < D} |CmDot(v, w_o[e, q*d : q*d + d], d)|
// is an o_proj-sized product with |.| and the chunked row sum fused; the [P, D] product is
// never written. One CTA = (32 * TJ tokens, query head q). Its 256 threads are 32 token groups
// x 8 "chunk slots": the CTA walks the D rows in groups of 8 chunks of 64 (512 rows), and slot
// s of the group owns chunk 8k + s entirely, so each chunk sum z_c = seq_e |dot_e| runs in one
// thread's registers, in e order. Per step the CTA stages 32 W_O rows (4 consecutive rows of
// each of the 8 chunks) in shared memory with cp.async (double-buffered; the device copy of
// W_O is lane-major, so rows are plain 16-byte copies) and every thread forms TJ x 4 complete
// dot products (DotTile; TJ x 4 keeps the kernel at ~200 registers without spills). After a group, the 8 slots' chunk sums form the aligned 8-leaf
// subtree of CmTreeSum by three xor shuffles; the subtree sums go into a TreeAccumulator.
// CmTreeSum over M values equals the aligned power-of-two tree over the values padded with
// zeros (x + 0 == x for the non-negative chunk sums, which are never -0), so chunks past D
// (all-zero rows) change no bit. Cost is FP32 issue: 2 d D operations per (token, query head)
// and no FMA allowed, so the kernel keeps the inner loop to FMUL/FADD with one 16-byte shared
// load per 16 multiply-adds.
//
// QuadFormKernel: per (token, matrix) y_i = CmDot(M[i, :], x, d) for every row i and then
// CmDot(x, y, d) (LaProx / CriticalKV-l2: Gram norms of values; Expected Attention: logits of
// keys, with lin = CmDot(mu, k, d)). One CTA = (32 * TJ tokens, one matrix); thread (token
// group, lane l) forms the y_i of the rows i = l (mod 8) (8 per staged pass of 64 rows) and
// runs canonical lane l of CmDot(x, y) over them in increasing i, so CmDot(x, y)'s lanes are
// the 8 threads of a token group, combined by CmDot's tree with three xor shuffles.
//
// Zero signs (model_dot_tile.cuh): the dot products of DotTile may differ from the CPU's only
// in the sign of a zero result. That never reaches a score: the L1 terms go through |.|; the
// Gram y_i only feed CmDot(v, y), whose zero result is clamped by max(0, .) before the root;
// the covariance y_i feed quad, and a logit that is a zero of either sign exponentiates to 1
// while a nonzero addend absorbs a zero of either sign.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/canonical_math.h"
#include "kernels/canonical_attention.h"
#include "kernels/gpu/kernels/attention_common.cuh"
#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/attention_score.cuh"
#include "kernels/gpu/kernels/attention_stats.cuh"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/model_dot_tile.cuh"
#include "kernels/gpu/kernels/pooling.cuh"

namespace kvtrim::gpu {

namespace {

using attn::ToF32;
using model::CpAsync16;
using model::CpAsyncCommit;
using model::CpAsyncWait;
using model::DotTile;
using model::ReduceLaneBits012;

constexpr int kTileThreads = 256;   // 8 warps = 32 token groups x 8
constexpr int kStageRows = 64;      // rows staged per pass of QuadForm
constexpr int kL1RowsPerChunkStep = 4;  // ProjectedL1: rows of each chunk per step
constexpr int kL1StepsPerChunk = 64 / kL1RowsPerChunkStep;
constexpr int kL1StageRows = 8 * kL1RowsPerChunkStep;  // rows staged per ProjectedL1 step
constexpr int kChunk = static_cast<int>(kCanonicalChunk);
constexpr int kSoftmaxThreads = 512;
constexpr int kSubtree = 64;        // EaSoftmaxKernel: chunk sums per first-level subtree
constexpr int kMaxSubtrees = 1024;  // n <= 2^22 tokens -> at most 1024 subtrees

/// Tokens per thread of the tiled kernels for E floats per lane (registers and shared memory).
template <int E>
__host__ __device__ constexpr int TileTokens() {
  return E <= 16 ? 4 : 2;
}

// ---- ProjectedL1Kernel ------------------------------------------------------------------------

struct L1Args {
  const void* values;  // [H_kv, n, d] dtype
  DType dtype;
  const float* w_o;    // [H_q, D, 8E] lane-major rows
  int64_t n;
  int64_t count;       // tokens scored: j < count (P)
  int32_t d, hidden, group;
  float* out;          // [H_q, n]: n_q[j] for j < count
};

/// Dynamic shared memory of the tiled kernels: x tile [32 TJ][8E], two stages of `stage_rows`
/// rows at stride 8E + 4 (conflict-free 16-byte reads of 8 consecutive rows), plus `extra`
/// floats.
template <int E>
__host__ __device__ constexpr size_t TileSmemBytes(int stage_rows, int extra) {
  return sizeof(float) * (static_cast<size_t>(32 * TileTokens<E>()) * 8 * E +
                          2 * static_cast<size_t>(stage_rows) * (8 * E + 4) + extra);
}

/// Element `i` of a tensor of `dtype`, widened exactly to fp32 (a runtime switch: the tiles
/// load once per CTA, so one kernel serves every dtype).
__device__ __forceinline__ float LoadF32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16: return ToF32(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return ToF32(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF32:
    default: return static_cast<const float*>(base)[i];
  }
}

/// Loads the x tile: tokens j0 + tl (tl < rows) of the head whose [n, d] rows start at element
/// `head_offset` of `src`, as lane-major fp32 (zero past `count` and past d).
template <int E>
__device__ __forceinline__ void LoadTokenTile(const void* src, DType dtype, int64_t head_offset,
                                              int64_t j0, int64_t count, int d, float* tile,
                                              int rows) {
  constexpr int VF = 8 * E;
  for (int idx = threadIdx.x; idx < rows * VF; idx += kTileThreads) {
    const int tl = idx / VF;
    const int pos = idx % VF;
    const int i = pos / E + 8 * (pos % E);
    float v = 0.0f;
    if (j0 + tl < count && i < d) v = LoadF32(src, dtype, head_offset + (j0 + tl) * d + i);
    tile[idx] = v;
  }
}

template <int E>
__global__ void __launch_bounds__(kTileThreads, 1) ProjectedL1Kernel(L1Args a) {
  constexpr int TJ = TileTokens<E>();
  constexpr int TU = kL1RowsPerChunkStep;
  constexpr int VF = 8 * E;
  constexpr int S = VF + 4;
  constexpr int BJ = 32 * TJ;
  extern __shared__ float4 smem4[];
  float* vs = reinterpret_cast<float*>(smem4);  // [BJ][VF]
  float* ws = vs + BJ * VF;                     // [2][32][S]: row u * 8 + c = row u of slot c

  const int tid = threadIdx.x;
  const int slot = tid & 7;                           // chunk slot of the group
  const int tg = (tid >> 5) * 4 + ((tid & 31) >> 3);  // token group: tokens tg + 32 tj
  const int q = blockIdx.y;
  const int h = q / a.group;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BJ;
  const float* wq = a.w_o + static_cast<int64_t>(q) * a.hidden * VF;
  LoadTokenTile<E>(a.values, a.dtype, static_cast<int64_t>(h) * a.n * a.d, j0, a.count, a.d, vs,
                   BJ);

  const int chunks = (a.hidden + kChunk - 1) / kChunk;  // M
  const int steps = (chunks + 7) / 8 * kL1StepsPerChunk;
  // Step t = 16k + s stages rows 64 (8k + c) + 4s + u (u < 4) of every chunk slot c, at
  // shared row u * 8 + c; rows past D are zero-filled.
  auto stage = [&](int t) {
    const int k = t / kL1StepsPerChunk;
    const int s = t % kL1StepsPerChunk;
    float* dst = ws + (t & 1) * kL1StageRows * S;
    for (int idx = tid; idx < kL1StageRows * (VF / 4); idx += kTileThreads) {
      const int row = idx / (VF / 4);
      const int f = idx % (VF / 4);
      const int64_t e = static_cast<int64_t>(kChunk) * (8 * k + (row & 7)) + TU * s + (row >> 3);
      const bool valid = e < a.hidden;
      CpAsync16(dst + row * S + 4 * f, valid ? wq + e * VF + 4 * f : wq, valid);
    }
    CpAsyncCommit();
  };

  float z[TJ];  // chunk sums of the slot's current chunk
#pragma unroll
  for (int tj = 0; tj < TJ; ++tj) z[tj] = 0.0f;
  TreeAccumulator<9> tree;  // over the 8-chunk subtree sums (up to 511: D < 2^18)
  stage(0);
  for (int t = 0; t < steps; ++t) {
    if (t + 1 < steps) {
      stage(t + 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int k = t / kL1StepsPerChunk;
    if (8 * k + slot < chunks) {
      float dots[TJ][TU];
      DotTile<E, TJ, TU>(vs + tg * VF, 32 * VF, ws + (t & 1) * kL1StageRows * S + slot * S,
                         8 * S, dots);
#pragma unroll
      for (int tj = 0; tj < TJ; ++tj) {
#pragma unroll
        for (int u = 0; u < TU; ++u) z[tj] = CmAdd(z[tj], fabsf(dots[tj][u]));
      }
    }
    if (t % kL1StepsPerChunk == kL1StepsPerChunk - 1) {  // the group's 8 chunks are complete
      float mine = 0.0f;
#pragma unroll
      for (int tj = 0; tj < TJ; ++tj) {
        const float sub = ReduceLaneBits012(z[tj]);  // aligned 8-leaf subtree
        if (slot == tj) mine = sub;
        z[tj] = 0.0f;
      }
      tree.Push(mine);  // slots >= TJ push a copy nobody reads
    }
    __syncthreads();  // the next step overwrites the stage just read
  }
  if (slot < TJ) {
    const int64_t j = j0 + tg + 32 * slot;
    if (j < a.count) a.out[static_cast<int64_t>(q) * a.n + j] = tree.Sum();
  }
}

// ---- QuadFormKernel -------------------------------------------------------------------------

struct QuadArgs {
  const void* x;       // [H_kv, n, d] dtype (values: Gram norms; keys: EA logits)
  DType dtype;
  const float* mats;   // [mats, d, 8E] lane-major rows
  const float* mean;   // [mats, 8E] lane-major (EA)
  int64_t n;
  int64_t count;       // tokens scored: j < count
  int32_t d, mats_per_kv;
  float scale, half_scale2;  // EA
  float* out;          // [mats, n]
};

template <int E, bool kEA>
__global__ void __launch_bounds__(kTileThreads, 1) QuadFormKernel(QuadArgs a) {
  constexpr int TJ = TileTokens<E>();
  constexpr int VF = 8 * E;
  constexpr int S = VF + 4;
  constexpr int BJ = 32 * TJ;
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);  // [BJ][VF]
  float* ws = xs + BJ * VF;                     // [2][64][S]: rows 64p + slot
  float* mus = ws + 2 * kStageRows * S;         // [VF] (EA)

  const int tid = threadIdx.x;
  const int lane = tid & 7;
  const int tg = (tid >> 5) * 4 + ((tid & 31) >> 3);
  const int mat = blockIdx.y;
  const int h = mat / a.mats_per_kv;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BJ;
  const float* rows = a.mats + static_cast<int64_t>(mat) * a.d * VF;
  LoadTokenTile<E>(a.x, a.dtype, static_cast<int64_t>(h) * a.n * a.d, j0, a.count, a.d, xs, BJ);
  if constexpr (kEA) {
    for (int i = tid; i < VF; i += kTileThreads) mus[i] = a.mean[static_cast<int64_t>(mat) * VF + i];
  }
  const int passes = (a.d + kStageRows - 1) / kStageRows;
  auto stage = [&](int p) {
    float* dst = ws + (p & 1) * kStageRows * S;
    for (int idx = tid; idx < kStageRows * (VF / 4); idx += kTileThreads) {
      const int row = idx / (VF / 4);
      const int f = idx % (VF / 4);
      const int i = kStageRows * p + row;
      const bool valid = i < a.d;
      CpAsync16(dst + row * S + 4 * f, valid ? rows + static_cast<int64_t>(i) * VF + 4 * f : rows,
                valid);
    }
    CpAsyncCommit();
  };

  float qc[TJ];  // canonical lane `lane` of CmDot(x, y)
#pragma unroll
  for (int tj = 0; tj < TJ; ++tj) qc[tj] = 0.0f;
  stage(0);
  for (int p = 0; p < passes; ++p) {
    if (p + 1 < passes) {
      stage(p + 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    // y_i for the rows i = 64p + 8u + lane (u < 8): canonical lane `lane`, m = 8p + u.
    float y[TJ][8];
    DotTile<E, TJ, 8>(xs + tg * VF, 32 * VF, ws + (p & 1) * kStageRows * S + lane * S, 8 * S, y);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = kStageRows * p + 8 * u + lane;
      if (i < a.d) {
#pragma unroll
        for (int tj = 0; tj < TJ; ++tj) {
          const float xi = xs[(tg + 32 * tj) * VF + lane * E + 8 * p + u];
          qc[tj] = CmAdd(qc[tj], CmMul(xi, y[tj][u]));
        }
      }
    }
    __syncthreads();
  }
  float result = 0.0f;
#pragma unroll
  for (int tj = 0; tj < TJ; ++tj) {
    const float quad = ReduceLaneBits012(qc[tj]);
    float r;
    if constexpr (kEA) {
      float lin = 0.0f;  // canonical lane `lane` of CmDot(mu, k, d)
      for (int m = 0; m < E && lane + 8 * m < a.d; ++m) {
        lin = CmAdd(lin, CmMul(mus[lane * E + m], xs[(tg + 32 * tj) * VF + lane * E + m]));
      }
      lin = ReduceLaneBits012(lin);
      r = CmAdd(CmMul(lin, a.scale), CmMul(quad, a.half_scale2));
    } else {
      r = CmSqrt(quad > 0.0f ? quad : 0.0f);
    }
    if (lane == tj) result = r;
  }
  if (lane < TJ) {
    const int64_t j = j0 + tg + 32 * lane;
    if (j < a.count) a.out[static_cast<int64_t>(mat) * a.n + j] = result;
  }
}

// ---- Expected Attention: softmax statistics and scores -------------------------------------

/// One CTA per query head q: M = max_j l_j, z_c = seq_{j in chunk c} CmExp(CmAdd(l_j, -M)),
/// Z = CmTreeSum over the chunk sums (aligned subtrees of 64, then the tree over them),
/// qstats[q] = (-M, CmDiv(1, Z)). chunk_sums is [H_q, ceil(n / 64)] scratch.
__global__ void __launch_bounds__(kSoftmaxThreads)
    EaSoftmaxKernel(const float* __restrict__ logits, int64_t n, float* chunk_sums,
                    float2* qstats) {
  __shared__ float red[kSoftmaxThreads / 32];
  __shared__ float sub[kMaxSubtrees];
  const int q = blockIdx.x;
  const int tid = threadIdx.x;
  const float* row = logits + static_cast<int64_t>(q) * n;
  float m = -INFINITY;
  for (int64_t j = tid; j < n; j += kSoftmaxThreads) m = fmaxf(m, row[j]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (tid % 32 == 0) red[tid / 32] = m;
  __syncthreads();
  float max_logit = red[0];
  for (int k = 1; k < kSoftmaxThreads / 32; ++k) max_logit = fmaxf(max_logit, red[k]);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  float* cs = chunk_sums + static_cast<int64_t>(q) * chunks;
  for (int64_t c = tid; c < chunks; c += kSoftmaxThreads) {
    const int64_t hi = c * kChunk + kChunk < n ? c * kChunk + kChunk : n;
    float z = 0.0f;
    for (int64_t j = c * kChunk; j < hi; ++j) z = CmAdd(z, CmExp(CmAdd(row[j], -max_logit)));
    cs[c] = z;
  }
  __syncthreads();  // chunk sums (global) visible to the block
  const int64_t subtrees = (chunks + kSubtree - 1) / kSubtree;
  for (int64_t t = tid; t < subtrees; t += kSoftmaxThreads) {
    TreeAccumulator<7> tree;
    const int64_t hi = (t + 1) * kSubtree < chunks ? (t + 1) * kSubtree : chunks;
    for (int64_t c = t * kSubtree; c < hi; ++c) tree.Push(cs[c]);
    sub[t] = tree.Sum();
  }
  __syncthreads();
  if (tid == 0) {
    TreeAccumulator<12> tree;
    for (int64_t t = 0; t < subtrees; ++t) tree.Push(sub[t]);
    qstats[q] = make_float2(-max_logit, CmDiv(1.0f, tree.Sum()));
  }
}

struct EaScoreArgs {
  const void* values;     // [H_kv, n, d] T (use_vnorm)
  const float* logits;    // [H_q, n]
  const float2* qstats;   // [H_q]: (-M, 1/Z)
  int64_t n;
  int32_t num_kv_heads, group, d;
  float eps;
  bool use_vnorm;
  float* out;             // [H_kv, n]
};

/// Eight threads per (h, j): canonical lane t of CmDot(v, v, d), then
/// ea = CmAdd(CmDiv(seq_g CmMul(CmExp(CmAdd(l_{q,j}, -M_q)), 1/Z_q), G), eps) and the score.
template <typename T>
__global__ void __launch_bounds__(256) EaScoreKernel(EaScoreArgs a) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
  const int lane = threadIdx.x & 7;
  const int64_t total = static_cast<int64_t>(a.num_kv_heads) * a.n;
  const bool valid = item < total;
  const int64_t h = valid ? item / a.n : 0;
  const int64_t j = valid ? item % a.n : 0;
  float vv = 0.0f;
  if (a.use_vnorm) {  // uniform
    float part = 0.0f;
    if (valid) {
      const T* v = static_cast<const T*>(a.values) + (h * a.n + j) * a.d;
      for (int c = lane; c < a.d; c += 8) {
        const float x = ToF32(v[c]);
        part = CmAdd(part, CmMul(x, x));
      }
    }
    vv = ReduceLaneBits012(part);
  }
  if (!valid || lane != 0) return;
  float acc = 0.0f;
  for (int g = 0; g < a.group; ++g) {
    const int64_t q = h * a.group + g;
    const float2 st = a.qstats[q];
    acc = CmAdd(acc, CmMul(CmExp(CmAdd(a.logits[q * a.n + j], st.x)), st.y));
  }
  const float ea = CmAdd(CmDiv(acc, static_cast<float>(a.group)), a.eps);
  a.out[h * a.n + j] = a.use_vnorm ? CmMul(ea, CmSqrt(vv)) : ea;
}

// ---- Combines --------------------------------------------------------------------------------

/// CriticalKV: attention = CmDiv(seq_g pooled_q, G), critical = CmMul(CmAdd(attention, eps),
/// CmDiv(seq_g n_q, G)) for j < P; both 0 for j >= P. One thread per (h, j).
__global__ void __launch_bounds__(256)
    CriticalCombineKernel(const float* __restrict__ pooled, const float* __restrict__ norm,
                          int64_t n, int64_t prefix, int32_t num_kv_heads, int32_t group,
                          float eps, float* attention, float* critical) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= static_cast<int64_t>(num_kv_heads) * n) return;
  const int64_t h = item / n;
  const int64_t j = item % n;
  if (j >= prefix) {
    attention[item] = 0.0f;
    critical[item] = 0.0f;
    return;
  }
  float att = 0.0f;
  float nrm = 0.0f;
  for (int g = 0; g < group; ++g) {
    const int64_t at = (h * group + g) * n + j;
    att = CmAdd(att, pooled[at]);
    nrm = CmAdd(nrm, norm[at]);
  }
  const float fg = static_cast<float>(group);
  const float a = CmDiv(att, fg);
  attention[item] = a;
  critical[item] = CmMul(CmAdd(a, eps), CmDiv(nrm, fg));
}

/// LaProx p [H_kv, n] (0 for j >= P):
///   mean       CmMul(a[h, j], CmDiv(seq_g n_q[j], G))
///   head_bound CmDiv(seq_g CmMul(a_q[j], n_q[j]), G)
///   summed_wo  CmMul(a[h, j], n_h[j])
__global__ void __launch_bounds__(256)
    LaProxCombineKernel(const float* __restrict__ pooled, const float* __restrict__ norm,
                        int64_t n, int64_t prefix, int32_t num_kv_heads, int32_t group,
                        LaProxGqa gqa, float* scores) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= static_cast<int64_t>(num_kv_heads) * n) return;
  const int64_t h = item / n;
  const int64_t j = item % n;
  if (j >= prefix) {
    scores[item] = 0.0f;
    return;
  }
  const float fg = static_cast<float>(group);
  switch (gqa) {
    case LaProxGqa::kMean: {
      float s = 0.0f;
      for (int g = 0; g < group; ++g) s = CmAdd(s, norm[(h * group + g) * n + j]);
      scores[item] = CmMul(pooled[item], CmDiv(s, fg));
      break;
    }
    case LaProxGqa::kHeadBound: {
      float s = 0.0f;
      for (int g = 0; g < group; ++g) {
        const int64_t at = (h * group + g) * n + j;
        s = CmAdd(s, CmMul(pooled[at], norm[at]));
      }
      scores[item] = CmDiv(s, fg);
      break;
    }
    case LaProxGqa::kSummedWo:
    default:
      scores[item] = CmMul(pooled[item], norm[item]);
      break;
  }
}

// ---- Plan ------------------------------------------------------------------------------------

/// Everything one LaunchModelScore needs: validated shapes and the scratch layout.
struct ModelPlan {
  ScorerKind kind = ScorerKind::kCriticalKV;
  attn::AttentionPlan attn;   // criticalkv, laprox (scratch at offset 0)
  int32_t num_kv_heads = 0, num_query_heads = 0, group = 0, head_dim = 0, lane_elems = 8;
  int64_t n = 0;
  int64_t prefix = 0;         // P (n for expected attention)
  int32_t pre_rows = 0;       // rows of the reduced window attention (H_q or H_kv)
  int32_t norm_rows = 0;      // rows of the norms (H_q or H_kv)
  size_t pre_offset = 0;      // [pre_rows, n]
  size_t pooled_offset = 0;   // [pre_rows, n]
  size_t norm_offset = 0;     // [norm_rows, n] (EA: logits [H_q, n])
  size_t chunk_offset = 0;    // EA: [H_q, ceil(n / 64)]
  size_t qstats_offset = 0;   // EA: [H_q] float2
  size_t scratch_bytes = 0;
};

cudaError_t MakeModelPlan(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                          const DeviceModelInputs& model, ModelPlan* plan) {
  if (!IsModelScorer(kind) || plan == nullptr) return cudaErrorInvalidValue;
  if (layer.keys == nullptr || layer.num_kv_heads < 1 || layer.num_tokens < 0 ||
      layer.head_dim < 1 || layer.head_dim > attn::kMaxHeadDim) {
    return cudaErrorInvalidValue;
  }
  ModelPlan p;
  p.kind = kind;
  p.num_kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.lane_elems = LaneElems(layer.head_dim);
  p.n = layer.num_tokens;
  const size_t n = static_cast<size_t>(p.n);
  size_t offset = 0;
  if (kind == ScorerKind::kExpectedAttention) {
    if (model.ea_mean == nullptr || model.ea_cov == nullptr ||
        model.num_query_heads < layer.num_kv_heads ||
        model.num_query_heads % layer.num_kv_heads != 0 ||
        (params.use_vnorm && layer.values == nullptr)) {
      return cudaErrorInvalidValue;
    }
    if (p.n > (int64_t{1} << 22)) return cudaErrorInvalidValue;  // subtree table of the softmax
    p.num_query_heads = model.num_query_heads;
    p.group = model.num_query_heads / layer.num_kv_heads;
    p.prefix = p.n;
    p.norm_rows = p.num_query_heads;
    p.norm_offset = offset;
    offset += Align256(static_cast<size_t>(p.num_query_heads) * n * sizeof(float));
    p.chunk_offset = offset;
    offset += Align256(static_cast<size_t>(p.num_query_heads) *
                       static_cast<size_t>((p.n + kChunk - 1) / kChunk) * sizeof(float));
    p.qstats_offset = offset;
    offset += Align256(static_cast<size_t>(p.num_query_heads) * sizeof(float2));
    p.scratch_bytes = offset;
    *plan = p;
    return cudaSuccess;
  }
  // CriticalKV, LaProx: the windowed attention rows of SnapKV without its pooling.
  if (params.kernel < 1 || params.kernel % 2 == 0 || layer.values == nullptr) {
    return cudaErrorInvalidValue;
  }
  ScorerParams rows = params;
  rows.kernel = 1;
  cudaError_t err = attn::MakeAttentionPlan(kLastWindowProbabilities, layer, rows, &p.attn);
  if (err != cudaSuccess) return err;
  p.num_query_heads = layer.num_query_heads;
  p.group = p.attn.group;
  p.prefix = p.n - params.window;
  if (kind == ScorerKind::kCriticalKV) {
    if (params.norm_l2 ? model.head_gram == nullptr
                       : (model.w_o == nullptr || model.hidden < 1)) {
      return cudaErrorInvalidValue;
    }
    p.attn.reduce = attn::Reduce::kPerQMean;
    p.pre_rows = p.num_query_heads;
    p.norm_rows = p.num_query_heads;
  } else {
    const bool summed = params.gqa == LaProxGqa::kSummedWo;
    if (summed ? model.group_gram == nullptr : model.head_gram == nullptr) {
      return cudaErrorInvalidValue;
    }
    const bool per_head = params.gqa == LaProxGqa::kHeadBound;
    p.attn.reduce = per_head ? attn::Reduce::kPerQSq : attn::Reduce::kGroupSq;
    p.pre_rows = per_head ? p.num_query_heads : p.num_kv_heads;
    p.norm_rows = summed ? p.num_kv_heads : p.num_query_heads;
  }
  offset = Align256(p.attn.scratch_bytes);
  p.pre_offset = offset;
  offset += Align256(static_cast<size_t>(p.pre_rows) * n * sizeof(float));
  p.pooled_offset = offset;
  offset += Align256(static_cast<size_t>(p.pre_rows) * n * sizeof(float));
  p.norm_offset = offset;
  offset += Align256(static_cast<size_t>(p.norm_rows) * n * sizeof(float));
  p.scratch_bytes = offset;
  *plan = p;
  return cudaSuccess;
}

/// Opts a kernel into `smem` bytes of dynamic shared memory and launches it.
template <typename Kernel, typename Args>
cudaError_t LaunchTiled(Kernel kernel, dim3 grid, size_t smem, const Args& args,
                        cudaStream_t stream) {
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<grid, kTileThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

template <int E>
cudaError_t LaunchL1Typed(const L1Args& args, int32_t num_query_heads, cudaStream_t stream) {
  const int64_t bj = 32 * TileTokens<E>();
  const dim3 grid(static_cast<unsigned>((args.count + bj - 1) / bj),
                  static_cast<unsigned>(num_query_heads));
  return LaunchTiled(ProjectedL1Kernel<E>, grid, TileSmemBytes<E>(kL1StageRows, 0), args, stream);
}

template <int E>
cudaError_t LaunchQuadTyped(const QuadArgs& args, int32_t mats, bool ea, cudaStream_t stream) {
  const int64_t bj = 32 * TileTokens<E>();
  const dim3 grid(static_cast<unsigned>((args.count + bj - 1) / bj), static_cast<unsigned>(mats));
  if (ea) {
    return LaunchTiled(QuadFormKernel<E, true>, grid, TileSmemBytes<E>(kStageRows, 8 * E), args,
                       stream);
  }
  return LaunchTiled(QuadFormKernel<E, false>, grid, TileSmemBytes<E>(kStageRows, 0), args,
                     stream);
}

cudaError_t LaunchL1(const L1Args& args, int lane_elems, int32_t num_query_heads,
                     cudaStream_t stream) {
  switch (lane_elems) {
    case 8: return LaunchL1Typed<8>(args, num_query_heads, stream);
    case 16: return LaunchL1Typed<16>(args, num_query_heads, stream);
    case 32: return LaunchL1Typed<32>(args, num_query_heads, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchQuad(const QuadArgs& args, int lane_elems, int32_t mats, bool ea,
                       cudaStream_t stream) {
  switch (lane_elems) {
    case 8: return LaunchQuadTyped<8>(args, mats, ea, stream);
    case 16: return LaunchQuadTyped<16>(args, mats, ea, stream);
    case 32: return LaunchQuadTyped<32>(args, mats, ea, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchEaScore(const EaScoreArgs& args, DType dtype, cudaStream_t stream) {
  const int64_t threads = static_cast<int64_t>(args.num_kv_heads) * args.n * 8;
  const int64_t blocks = (threads + 255) / 256;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(blocks);
  switch (dtype) {
    case DType::kF32: EaScoreKernel<float><<<grid, 256, 0, stream>>>(args); break;
    case DType::kF16: EaScoreKernel<__half><<<grid, 256, 0, stream>>>(args); break;
    case DType::kBF16: EaScoreKernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(args); break;
  }
  return cudaGetLastError();
}

/// Grid of a one-thread-per-(h, j) kernel.
unsigned ItemBlocks(int64_t items) { return static_cast<unsigned>((items + 255) / 256); }

}  // namespace

size_t ModelScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                              const ScorerParams& params, const DeviceModelInputs& model) {
  ModelPlan plan;
  if (MakeModelPlan(kind, layer, params, model, &plan) != cudaSuccess) return 0;
  return plan.scratch_bytes;
}

cudaError_t LaunchModelScore(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                             const DeviceModelInputs& model, float* scores, float* critical,
                             void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  ModelPlan plan;
  cudaError_t err = MakeModelPlan(kind, layer, params, model, &plan);
  if (err != cudaSuccess) return err;
  if (plan.n == 0) return cudaSuccess;
  if (scores == nullptr || (kind == ScorerKind::kCriticalKV && critical == nullptr) ||
      scratch == nullptr || scratch_bytes < plan.scratch_bytes) {
    return cudaErrorInvalidValue;
  }
  if (plan.num_query_heads > 65535 || plan.num_kv_heads > 65535) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  const int64_t items = static_cast<int64_t>(plan.num_kv_heads) * plan.n;

  if (kind == ScorerKind::kExpectedAttention) {
    float* logits = reinterpret_cast<float*>(base + plan.norm_offset);
    QuadArgs qa{layer.keys,    layer.dtype,         model.ea_cov,      model.ea_mean,
                plan.n,        plan.n,              plan.head_dim,     plan.group,
                layer.softmax_scale, model.half_scale2, logits};
    err = LaunchQuad(qa, plan.lane_elems, plan.num_query_heads, true, stream);
    if (err != cudaSuccess) return err;
    float* chunks = reinterpret_cast<float*>(base + plan.chunk_offset);
    float2* qstats = reinterpret_cast<float2*>(base + plan.qstats_offset);
    EaSoftmaxKernel<<<plan.num_query_heads, kSoftmaxThreads, 0, stream>>>(logits, plan.n, chunks,
                                                                          qstats);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    EaScoreArgs sa{layer.values, logits,     qstats, plan.n,          plan.num_kv_heads,
                   plan.group,   plan.head_dim, params.eps, params.use_vnorm, scores};
    return LaunchEaScore(sa, layer.dtype, stream);
  }

  float* pre = reinterpret_cast<float*>(base + plan.pre_offset);
  float* pooled = reinterpret_cast<float*>(base + plan.pooled_offset);
  float* norm = reinterpret_cast<float*>(base + plan.norm_offset);
  if (plan.prefix > 0) {
    err = attn::LaunchAttentionStats(plan.attn, layer, scratch, stream);
    if (err != cudaSuccess) return err;
    err = attn::LaunchAttentionScores(plan.attn, layer, params, scratch, pre, stream);
    if (err != cudaSuccess) return err;
    err = LaunchPool1DStrided(pre, plan.n, plan.pre_rows, plan.prefix, params.kernel,
                              params.pool_max, pooled, plan.n, stream);
    if (err != cudaSuccess) return err;
    if (kind == ScorerKind::kCriticalKV && !params.norm_l2) {
      L1Args la{layer.values, layer.dtype, model.w_o,  plan.n, plan.prefix,
                plan.head_dim, model.hidden, plan.group, norm};
      err = LaunchL1(la, plan.lane_elems, plan.num_query_heads, stream);
    } else {
      const bool summed = kind == ScorerKind::kLaProx && params.gqa == LaProxGqa::kSummedWo;
      QuadArgs qa{layer.values,
                  layer.dtype,
                  summed ? model.group_gram : model.head_gram,
                  nullptr,
                  plan.n,
                  plan.prefix,
                  plan.head_dim,
                  summed ? 1 : plan.group,
                  0.0f,
                  0.0f,
                  norm};
      err = LaunchQuad(qa, plan.lane_elems, plan.norm_rows, false, stream);
    }
    if (err != cudaSuccess) return err;
  }
  if (kind == ScorerKind::kCriticalKV) {
    CriticalCombineKernel<<<ItemBlocks(items), 256, 0, stream>>>(
        pooled, norm, plan.n, plan.prefix, plan.num_kv_heads, plan.group, params.eps, scores,
        critical);
  } else {
    LaProxCombineKernel<<<ItemBlocks(items), 256, 0, stream>>>(
        pooled, norm, plan.n, plan.prefix, plan.num_kv_heads, plan.group, params.gqa, scores);
  }
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
