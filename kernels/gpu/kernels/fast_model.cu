// Fast numerics of the model-aware scorers (fast_model.cuh). Every product runs on tensor
// cores as mma.sync m16n8k16 with f16 operands and fp32 accumulation (fast_mma.cuh).
//
// Operands in f16, exactly where it matters:
//  * Token rows (V for the norms, K for Expected Attention) go straight from global memory
//    into A fragments: each row is scaled by the power of two 2^k_j that takes its largest
//    |x| into [2^14, 2^15) and rounded to f16. For bf16 and f16 inputs that is exact (8 or
//    11 significant bits fit f16's 11; only elements below 2^-28 of the row's largest change,
//    by at most 2^-25 of the scaled unit); f32 inputs become f16 hi + lo pairs (22 bits).
//    The scale is undone exactly at the end (the |.| row sums and the quadratic forms are
//    homogeneous: ||s v W||_1 = s ||v W||_1, (s x) M (s x) = s^2 x M x).
//  * W_O (CriticalKV l1) is rounded once to f16 on upload, per query head scaled by a power
//    of two the same way (FastWoImage): relative rounding error u = 2^-11 per element.
//  * Gram and covariance matrices (d x d) are split per call into f16 hi + lo (22 bits),
//    scaled per matrix: their error is below 2^-22 per element.
//
// Error of the CriticalKV l1 norm n = sum_e |y_e|, y_e = sum_i v_i W[i, e], with W rounded
// to W(1 + d_ie), |d_ie| <= u = 2^-11, products exact and fp32 accumulation (gamma_k = k 2^-24):
//   |n_fast - n| <= u * sum_e sum_i |v_i W[i, e]| + (d + D/4 + 4) 2^-24 * (the same sum)
//               = (u + ~2^-17) * kappa * n,   kappa = sum_e sum_i |v_i W_ie| / sum_e |y_e|.
// kappa is the cancellation of the dot products, about sqrt(2 d / pi) ~ 9 for d = 128 on
// random data, so the rigorous bound is ~4.4e-3 relative. The rounding errors are independent
// with mean 0, so the actual error of n is a sum of D signed terms: its standard deviation is
// u * sqrt(pi / 6) / sqrt(D) * n ~ 0.72 u / sqrt(D) relative: 4.4e-5 at D = 64 (the tests),
// 5.5e-6 at D = 4096; at 5 standard deviations 2.2e-4 and 2.8e-5, below tau = 2^-11.
// Quadratic forms q = x M x (Gram: LaProx, CriticalKV l2; covariance: Expected Attention)
// with M = hi + lo exact to 2^-22: |q_fast - q| <= (2^-22 + (2 d + 4) 2^-24) * sum |x_i M_ic x_c|,
// i.e. below 2^-15 * kappa_q |q| with kappa_q = sum |x_i M_ic x_c| / |q| (~ 1 + d / sqrt(D)
// for Gram matrices): ~1e-4 at kappa_q = 4, typically 1e-6. Expected Attention's logits
// carry that absolute error times |logit|, and the hardware exp2 adds 2 ulp: its
// probabilities are within ~1e-5 relative for logits of magnitude <= 10.
// The window attention of both (CriticalKV's per-query-head means, LaProx's per-query-head
// sqrt(sum_t p^2) or sqrt(sum_t m_t^2) of the group mean m_t) is one run of the fast
// attention passes (fast_attention.cuh) with the matching Reduce: the p of every row within
// the band of docs/numerics.md (tau), summed (and squared) in fp32, so the statistics carry
// p's relative error (sqrt halves that of the squares).
//
// Kernels (P = n - window):
//  CriticalKV l1    fast_l1.cu (mma.sync, and wgmma on Hopper).
//  quadratic forms  fast_quad.cu (mma.sync, and wgmma on Hopper).
//  PrepareMatsKernel lane-major fp32 matrices -> scaled f16 hi / lo planes (+ EA's mean).
//  EaStatsKernel, EaScoreKernel, CriticalCombineFast, LaProxCombineFast: fp32 epilogues.
#include "kernels/gpu/kernels/fast_model.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/canonical_math.h"
#include "base/dtype.h"
#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/attention_score.cuh"
#include "kernels/gpu/kernels/attention_stats.cuh"
#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/gpu/kernels/fast_l1.cuh"
#include "kernels/gpu/kernels/fast_mma.cuh"
#include "kernels/gpu/kernels/fast_model_tiles.cuh"
#include "kernels/gpu/kernels/fast_quad.cuh"
#include "kernels/gpu/kernels/pooling.cuh"

namespace kvtrim::gpu {

namespace {

using namespace fast_tiles;  // CpAsync*, LdMatrixX4, SmemAddress, tiles

constexpr int kStatsThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;

/// The padded dimension DP of head dimension d (8 <= d <= 128).
constexpr int PaddedDim(int d) { return d <= 64 ? 64 : 128; }

// ---- W_O image --------------------------------------------------------------------------------

/// The largest of the kThreads threads' values (warp xor tree, then the warps); every thread
/// gets it. `red` holds kWarps floats of shared memory.
__device__ __forceinline__ float BlockMaxOf(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < kWarps; ++w) v = fmaxf(v, red[w]);
  return v;
}

/// Builds the f16 W_O image on the device (LaunchBuildFastWo): one CTA per query head q reads
/// its [D, d] slice from the lane-major copy [H_q, D, 8E] (element i of row e at
/// (i % 8) E + i / 8), takes its largest |w|, then writes the scaled f16 rows and inv_scale[q].
__global__ void __launch_bounds__(kThreads)
    BuildFastWoKernel(const float* __restrict__ lane_major, int32_t d, int32_t hidden,
                      int32_t lane_elems, int32_t padded, size_t header_bytes, void* image) {
  __shared__ float red[kWarps];
  const int q = blockIdx.x;
  const int vf = 8 * lane_elems;
  const float* src = lane_major + static_cast<int64_t>(q) * hidden * vf;
  const int64_t elems = static_cast<int64_t>(hidden) * d;
  float mx = 0.0f;
  for (int64_t idx = threadIdx.x; idx < elems; idx += kThreads) {
    const int64_t e = idx / d;
    const int i = static_cast<int>(idx % d);
    mx = fmaxf(mx, fabsf(src[e * vf + (i % 8) * lane_elems + i / 8]));
  }
  const int k = ScaleExponent(BlockMaxOf(mx, red));
  const float s = CmPow2(k);
  char* base = static_cast<char*>(image);
  if (threadIdx.x == 0) reinterpret_cast<float*>(base)[q] = CmPow2(-k);
  __half* dst = reinterpret_cast<__half*>(base + header_bytes) +
                static_cast<int64_t>(q) * hidden * padded;
  const int64_t out_elems = static_cast<int64_t>(hidden) * padded;
  for (int64_t idx = threadIdx.x; idx < out_elems; idx += kThreads) {
    const int64_t e = idx / padded;
    const int i = static_cast<int>(idx % padded);
    const float v = i < d ? src[e * vf + (i % 8) * lane_elems + i / 8] * s : 0.0f;
    dst[idx] = __float2half_rn(v);
  }
}

// ---- Matrices for the quadratic forms -----------------------------------------------------------

/// One CTA per matrix: lane-major fp32 [mats, d, 8E] (row i, element c at (c % 8) E + c / 8)
/// -> planes [mats][2][DP][DP] f16 (hi = f16(s M), lo = f16(s M - hi), zero past d), inv[m] =
/// 1 / s with s the power of two of ScaleExponent(max |M|); with `mean` (EA, lane-major
/// [mats, 8E]) also mean_out [mats][DP] fp32 in natural order.
__global__ void __launch_bounds__(kThreads)
    PrepareMatsKernel(const float* __restrict__ mats, const float* __restrict__ mean, int32_t d,
                      int32_t lane_elems, int32_t padded, __half* planes, float* inv,
                      float* mean_out) {
  __shared__ float red[kWarps];
  const int mat = blockIdx.x;
  const int vf = 8 * lane_elems;
  const float* src = mats + static_cast<int64_t>(mat) * d * vf;
  float mx = 0.0f;
  for (int idx = threadIdx.x; idx < d * d; idx += kThreads) {
    const int i = idx / d;
    const int c = idx % d;
    mx = fmaxf(mx, fabsf(src[i * vf + (c % 8) * lane_elems + c / 8]));
  }
  const int k = ScaleExponent(BlockMaxOf(mx, red));
  const float s = CmPow2(k);
  if (threadIdx.x == 0) inv[mat] = CmPow2(-k);
  __half* hi = planes + static_cast<int64_t>(mat) * 2 * padded * padded;
  __half* lo = hi + padded * padded;
  for (int idx = threadIdx.x; idx < padded * padded; idx += kThreads) {
    const int i = idx / padded;
    const int c = idx % padded;
    const float v = (i < d && c < d) ? src[i * vf + (c % 8) * lane_elems + c / 8] * s : 0.0f;
    const __half vh = __float2half_rn(v);
    hi[idx] = vh;
    lo[idx] = __float2half_rn(v - __half2float(vh));
  }
  if (mean != nullptr) {
    for (int c = threadIdx.x; c < padded; c += kThreads) {
      mean_out[static_cast<int64_t>(mat) * padded + c] =
          c < d ? mean[static_cast<int64_t>(mat) * vf + (c % 8) * lane_elems + c / 8] : 0.0f;
    }
  }
}

// ---- Expected Attention: softmax and scores ---------------------------------------------------

/// Deterministic block reduction over kStatsThreads values (warp xor tree, then the warps in
/// order); `is_max` picks max, else sum. Every thread gets the result.
__device__ float BlockReduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float out = red[0];
  for (int w = 1; w < kStatsThreads / 32; ++w) out = is_max ? fmaxf(out, red[w]) : out + red[w];
  __syncthreads();
  return out;
}

/// One CTA per query head q: M = max_j l_j, Z = sum_j 2^((l_j - M) log2 e) (thread-strided
/// sums in j order, then BlockReduce); qstats[q] = (M, 1 / Z).
__global__ void __launch_bounds__(kStatsThreads)
    EaStatsKernel(const float* __restrict__ logits, int64_t n, float2* qstats) {
  __shared__ float red[kStatsThreads / 32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * n;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kStatsThreads) m = fmaxf(m, row[j]);
  m = BlockReduce(m, true, red);
  const float base = m * kLog2e;
  float z = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kStatsThreads) {
    z += fast::Exp2(fmaf(row[j], kLog2e, -base));
  }
  z = BlockReduce(z, false, red);
  if (threadIdx.x == 0) qstats[blockIdx.x] = make_float2(base, 1.0f / z);
}

struct EaScoreFastArgs {
  const void* values;    // [H_kv, n, d] T (use_vnorm)
  const float* logits;   // [H_q, n]
  const float2* qstats;  // [H_q]: (M log2 e, 1 / Z)
  int64_t n;
  int32_t num_kv_heads, group, d;
  float eps;
  bool use_vnorm;
  float* out;            // [H_kv, n]
};

/// Eight threads per (h, j): |v_j|^2 in fp32 (elements lane, lane + 8, ...), then
/// ea = (sum_g 2^(l log2 e - M log2 e) / Z) / G + eps and the score.
template <typename T>
__global__ void __launch_bounds__(256) EaScoreFastKernel(EaScoreFastArgs a) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
  const int lane = threadIdx.x & 7;
  const int64_t total = static_cast<int64_t>(a.num_kv_heads) * a.n;
  const bool valid = item < total;
  const int64_t h = valid ? item / a.n : 0;
  const int64_t j = valid ? item % a.n : 0;
  float vv = 0.0f;
  if (a.use_vnorm) {  // uniform
    if (valid) {
      const T* v = static_cast<const T*>(a.values) + (h * a.n + j) * a.d;
      for (int c = lane; c < a.d; c += 8) {
        const float x = attn::ToF32(v[c]);
        vv = fmaf(x, x, vv);
      }
    }
    vv += __shfl_xor_sync(0xffffffffu, vv, 1);
    vv += __shfl_xor_sync(0xffffffffu, vv, 2);
    vv += __shfl_xor_sync(0xffffffffu, vv, 4);
  }
  if (!valid || lane != 0) return;
  float acc = 0.0f;
  for (int g = 0; g < a.group; ++g) {
    const int64_t q = h * a.group + g;
    const float2 st = a.qstats[q];
    acc += fast::Exp2(fmaf(a.logits[q * a.n + j], kLog2e, -st.x)) * st.y;
  }
  const float ea = acc / static_cast<float>(a.group) + a.eps;
  a.out[h * a.n + j] = a.use_vnorm ? ea * sqrtf(vv) : ea;
}

// ---- Combines ----------------------------------------------------------------------------------

/// CriticalKV (plain fp32): attention = (sum_g pooled[hG+g]) / G, critical =
/// (attention + eps) * (sum_g n_{hG+g}) / G for j < P; both 0 for j >= P. pooled [H_q, n].
__global__ void __launch_bounds__(256)
    CriticalCombineFast(const float* __restrict__ pooled, const float* __restrict__ norm,
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
    att += pooled[(h * group + g) * n + j];
    nrm += norm[(h * group + g) * n + j];
  }
  const float fg = static_cast<float>(group);
  const float at = att / fg;
  attention[item] = at;
  critical[item] = (at + eps) * (nrm / fg);
}

/// LaProx p [H_kv, n] (plain fp32; 0 for j >= P), as LaProxCombineKernel of model_scorers.cu.
__global__ void __launch_bounds__(256)
    LaProxCombineFast(const float* __restrict__ pooled, const float* __restrict__ norm, int64_t n,
                      int64_t prefix, int32_t num_kv_heads, int32_t group, LaProxGqa gqa,
                      float* scores) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= static_cast<int64_t>(num_kv_heads) * n) return;
  const int64_t h = item / n;
  const int64_t j = item % n;
  if (j >= prefix) {
    scores[item] = 0.0f;
    return;
  }
  const float fg = static_cast<float>(group);
  float s = 0.0f;
  switch (gqa) {
    case LaProxGqa::kMean:
      for (int g = 0; g < group; ++g) s += norm[(h * group + g) * n + j];
      scores[item] = pooled[item] * (s / fg);
      break;
    case LaProxGqa::kHeadBound:
      for (int g = 0; g < group; ++g) {
        const int64_t at = (h * group + g) * n + j;
        s += pooled[at] * norm[at];
      }
      scores[item] = s / fg;
      break;
    case LaProxGqa::kSummedWo:
    default:
      scores[item] = pooled[item] * norm[item];
      break;
  }
}

// ---- Plan ----------------------------------------------------------------------------------------

/// Everything one LaunchFastModelScore needs: validated shapes and the scratch layout.
struct FastModelPlan {
  ScorerKind kind = ScorerKind::kCriticalKV;
  DType dtype = DType::kBF16;
  int32_t num_kv_heads = 0, num_query_heads = 0, group = 0, head_dim = 0, padded_dim = 64;
  int32_t lane_elems = 8;
  int64_t n = 0;
  int64_t prefix = 0;            // P (n for expected attention)
  // Window attention (criticalkv, laprox).
  bool fast_attention = false;   // one run of the fast passes with the scorer's Reduce
  fast::FastAttentionPlan fast_attn;
  attn::AttentionPlan attn;      // the canonical passes where the fast plan is refused
  int32_t pre_rows = 0;          // rows of pre / pooled
  // Norms (criticalkv, laprox) or logits (expected attention).
  bool l1 = false;               // criticalkv l1: FastL1Kernel
  int32_t norm_rows = 0;         // rows of norm / logits
  int32_t mats = 0;              // matrices of FastQuadKernel
  int32_t mats_per_kv = 1;
  // Scratch regions (byte offsets, 256-byte aligned).
  size_t pre_offset = 0;         // [pre_rows, n] f32
  size_t pooled_offset = 0;      // [pre_rows, n] f32
  size_t norm_offset = 0;        // [norm_rows, n] f32 (EA: logits [H_q, n])
  size_t planes_offset = 0;      // [mats, 2, DP, DP] f16
  size_t mat_inv_offset = 0;     // [mats] f32
  size_t mean_offset = 0;        // [mats, DP] f32 (EA)
  size_t qstats_offset = 0;      // [H_q] float2 (EA)
  size_t scratch_bytes = 0;
};

cudaError_t MakeFastModelPlan(ScorerKind kind, const DeviceLayer& layer,
                              const ScorerParams& params, const DeviceModelInputs& model,
                              const FastModelInputs& fast_inputs, FastModelPlan* plan) {
  if (plan == nullptr || !IsModelScorer(kind) ||
      !FastModelSupported(kind, layer.dtype, layer.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (layer.keys == nullptr || layer.num_kv_heads < 1 || layer.num_kv_heads > 65535 ||
      layer.num_tokens < 0 || layer.num_tokens > (int64_t{1} << 31) - 1) {
    return cudaErrorInvalidValue;
  }
  FastModelPlan p;
  p.kind = kind;
  p.dtype = layer.dtype;
  p.num_kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.padded_dim = PaddedDim(layer.head_dim);
  p.lane_elems = LaneElems(layer.head_dim);
  p.n = layer.num_tokens;
  const size_t n = static_cast<size_t>(p.n);
  const size_t dp = static_cast<size_t>(p.padded_dim);
  size_t offset = 0;
  auto add = [&](size_t bytes) {
    const size_t at = offset;
    offset += Align256(bytes);
    return at;
  };
  auto add_mats = [&](int32_t mats, bool mean) {
    p.mats = mats;
    p.planes_offset = add(static_cast<size_t>(mats) * 2 * dp * dp * sizeof(__half));
    p.mat_inv_offset = add(static_cast<size_t>(mats) * sizeof(float));
    if (mean) p.mean_offset = add(static_cast<size_t>(mats) * dp * sizeof(float));
  };

  if (kind == ScorerKind::kExpectedAttention) {
    if (model.ea_mean == nullptr || model.ea_cov == nullptr ||
        model.num_query_heads < layer.num_kv_heads || model.num_query_heads > 65535 ||
        model.num_query_heads % layer.num_kv_heads != 0 ||
        (params.use_vnorm && layer.values == nullptr)) {
      return cudaErrorInvalidValue;
    }
    p.num_query_heads = model.num_query_heads;
    p.group = model.num_query_heads / layer.num_kv_heads;
    p.prefix = p.n;
    p.norm_rows = p.num_query_heads;
    p.mats_per_kv = p.group;
    p.norm_offset = add(static_cast<size_t>(p.num_query_heads) * n * sizeof(float));
    p.qstats_offset = add(static_cast<size_t>(p.num_query_heads) * sizeof(float2));
    add_mats(p.num_query_heads, true);
    p.scratch_bytes = offset;
    *plan = p;
    return cudaSuccess;
  }

  // CriticalKV, LaProx: the windowed attention rows of SnapKV without its pooling.
  if (params.kernel < 1 || params.kernel % 2 == 0 || layer.values == nullptr ||
      layer.num_query_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  ScorerParams rows = params;
  rows.kernel = 1;
  rows.fast = false;
  cudaError_t err = attn::MakeAttentionPlan(kLastWindowProbabilities, layer, rows, &p.attn);
  if (err != cudaSuccess) return err;
  p.num_query_heads = layer.num_query_heads;
  p.group = p.attn.group;
  p.prefix = p.n - params.window;
  if (kind == ScorerKind::kCriticalKV) {
    if (params.norm_l2 ? model.head_gram == nullptr
                       : (fast_inputs.w_o16 == nullptr || model.hidden < 1)) {
      return cudaErrorInvalidValue;
    }
    p.attn.reduce = attn::Reduce::kPerQMean;
    p.pre_rows = p.num_query_heads;
    p.norm_rows = p.num_query_heads;
    p.l1 = !params.norm_l2;
    p.mats_per_kv = p.group;
  } else {
    const bool summed = params.gqa == LaProxGqa::kSummedWo;
    if (summed ? model.group_gram == nullptr : model.head_gram == nullptr) {
      return cudaErrorInvalidValue;
    }
    const bool per_head = params.gqa == LaProxGqa::kHeadBound;
    p.attn.reduce = per_head ? attn::Reduce::kPerQSq : attn::Reduce::kGroupSq;
    p.pre_rows = per_head ? p.num_query_heads : p.num_kv_heads;
    p.norm_rows = summed ? p.num_kv_heads : p.num_query_heads;
    p.mats_per_kv = summed ? 1 : p.group;
  }
  // The window statistics from one run of the fast passes with the matching reduction
  // (SnapKV's rows, no pooling); the canonical passes where it is refused (kGroupSq with
  // G > 32). Either scratch lies at offset 0.
  const fast::Reduce reduce = p.attn.reduce == attn::Reduce::kPerQMean ? fast::Reduce::kPerQMean
                              : p.attn.reduce == attn::Reduce::kPerQSq ? fast::Reduce::kPerQSq
                                                                        : fast::Reduce::kGroupSq;
  p.fast_attention = fast::MakeFastAttentionPlan(kLastWindowProbabilities, layer, rows,
                                                 &p.fast_attn, reduce) == cudaSuccess;
  add(p.fast_attention ? p.fast_attn.scratch_bytes : p.attn.scratch_bytes);
  if (kind == ScorerKind::kCriticalKV) {
    if (!p.l1) add_mats(p.num_query_heads, false);
  } else {
    add_mats(p.norm_rows, false);
  }
  p.pre_offset = add(static_cast<size_t>(p.pre_rows) * n * sizeof(float));
  p.pooled_offset = add(static_cast<size_t>(p.pre_rows) * n * sizeof(float));
  p.norm_offset = add(static_cast<size_t>(p.norm_rows) * n * sizeof(float));
  p.scratch_bytes = offset;
  *plan = p;
  return cudaSuccess;
}

/// PrepareMatsKernel over the plan's matrices into the plan's scratch.
cudaError_t LaunchPrepareMats(const FastModelPlan& plan, const float* mats, const float* mean,
                              char* base, cudaStream_t stream) {
  PrepareMatsKernel<<<plan.mats, kThreads, 0, stream>>>(
      mats, mean, plan.head_dim, plan.lane_elems, plan.padded_dim,
      reinterpret_cast<__half*>(base + plan.planes_offset),
      reinterpret_cast<float*>(base + plan.mat_inv_offset),
      mean != nullptr ? reinterpret_cast<float*>(base + plan.mean_offset) : nullptr);
  return cudaGetLastError();
}

/// FastQuadKernel arguments of the plan over x [H_kv, n, d] into out [mats, n].
QuadFastArgs QuadArgsOf(const FastModelPlan& plan, const void* x, int64_t count, char* base,
                        float scale, float half_scale2, float* out) {
  QuadFastArgs q{};
  q.x = x;
  q.planes = reinterpret_cast<const __half*>(base + plan.planes_offset);
  q.mat_inv = reinterpret_cast<const float*>(base + plan.mat_inv_offset);
  q.mean = reinterpret_cast<const float*>(base + plan.mean_offset);
  q.n = plan.n;
  q.count = count;
  q.d = plan.head_dim;
  q.mats_per_kv = plan.mats_per_kv;
  q.scale = scale;
  q.half_scale2 = half_scale2;
  q.out = out;
  return q;
}

/// Grid of a one-thread-per-(h, j) kernel.
unsigned ItemBlocks(int64_t items) { return static_cast<unsigned>((items + 255) / 256); }

/// The window statistics of CriticalKV / LaProx into pre [pre_rows, n]: one run of the fast
/// passes (pass A, combine, pass B with the plan's Reduce), or the canonical passes.
cudaError_t LaunchWindowRows(const FastModelPlan& plan, const DeviceLayer& layer,
                             const ScorerParams& params, char* base, float* pre,
                             cudaStream_t stream) {
  if (!plan.fast_attention) {
    cudaError_t err = attn::LaunchAttentionStats(plan.attn, layer, base, stream);
    if (err != cudaSuccess) return err;
    return attn::LaunchAttentionScores(plan.attn, layer, params, base, pre, stream);
  }
  ScorerParams rows = params;
  rows.kernel = 1;
  rows.fast = true;
  return fast::LaunchFastAttentionScores(plan.fast_attn, layer, rows, base, pre, stream);
}

}  // namespace

FastWoLayout MakeFastWoLayout(int32_t num_query_heads, int32_t head_dim, int32_t hidden) {
  FastWoLayout l;
  l.num_query_heads = num_query_heads;
  l.head_dim = head_dim;
  l.hidden = hidden;
  l.padded_dim = PaddedDim(head_dim);
  l.header_bytes = Align256(static_cast<size_t>(std::max(num_query_heads, 0)) * sizeof(float));
  l.bytes = l.header_bytes + static_cast<size_t>(std::max(num_query_heads, 0)) *
                                 static_cast<size_t>(std::max(hidden, 0)) * l.padded_dim *
                                 sizeof(uint16_t);
  return l;
}

std::vector<uint8_t> FastWoImage(const float* w_o, int32_t num_query_heads, int32_t head_dim,
                                 int32_t hidden) {
  if (w_o == nullptr || num_query_heads < 1 || hidden < 1 || head_dim < 8 || head_dim > 128 ||
      head_dim % 8 != 0) {
    return {};
  }
  const FastWoLayout l = MakeFastWoLayout(num_query_heads, head_dim, hidden);
  std::vector<uint8_t> out(l.bytes, 0);
  const int64_t row = static_cast<int64_t>(num_query_heads) * head_dim;  // w_o row stride
  for (int32_t q = 0; q < num_query_heads; ++q) {
    float mx = 0.0f;
    for (int64_t e = 0; e < hidden; ++e) {
      for (int32_t i = 0; i < head_dim; ++i) {
        mx = std::max(mx, std::fabs(w_o[e * row + q * head_dim + i]));
      }
    }
    const int k = ScaleExponent(mx);
    const float s = CmPow2(k);
    const float inv = CmPow2(-k);
    std::memcpy(out.data() + q * sizeof(float), &inv, sizeof inv);
    uint8_t* dst = out.data() + l.header_bytes +
                   static_cast<size_t>(q) * hidden * l.padded_dim * sizeof(uint16_t);
    for (int64_t e = 0; e < hidden; ++e) {
      for (int32_t i = 0; i < head_dim; ++i) {
        const uint16_t bits = FloatToF16(w_o[e * row + q * head_dim + i] * s);
        std::memcpy(dst + (e * l.padded_dim + i) * sizeof(uint16_t), &bits, sizeof bits);
      }
    }
  }
  return out;
}

cudaError_t LaunchBuildFastWo(const float* w_o_lane_major, int32_t num_query_heads,
                              int32_t head_dim, int32_t hidden, void* image, cudaStream_t stream) {
  if (w_o_lane_major == nullptr || image == nullptr || num_query_heads < 1 ||
      num_query_heads > 65535 || hidden < 1 || head_dim < 8 || head_dim > 128 ||
      head_dim % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  const FastWoLayout l = MakeFastWoLayout(num_query_heads, head_dim, hidden);
  BuildFastWoKernel<<<num_query_heads, kThreads, 0, stream>>>(
      w_o_lane_major, head_dim, hidden, LaneElems(head_dim), l.padded_dim, l.header_bytes, image);
  return cudaGetLastError();
}

bool FastModelSupported(ScorerKind kind, DType dtype, int32_t head_dim) {
  const bool dtype_ok = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  return IsModelScorer(kind) && dtype_ok && head_dim >= 8 && head_dim <= 128 &&
         head_dim % 8 == 0;
}

size_t FastModelScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                                  const ScorerParams& params, const DeviceModelInputs& model,
                                  const FastModelInputs& fast_inputs) {
  FastModelPlan plan;
  if (MakeFastModelPlan(kind, layer, params, model, fast_inputs, &plan) != cudaSuccess) return 0;
  return plan.scratch_bytes;
}

cudaError_t LaunchFastModelScore(ScorerKind kind, const DeviceLayer& layer,
                                 const ScorerParams& params, const DeviceModelInputs& model,
                                 const FastModelInputs& fast_inputs, float* scores,
                                 float* critical, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream) {
  FastModelPlan plan;
  cudaError_t err = MakeFastModelPlan(kind, layer, params, model, fast_inputs, &plan);
  if (err != cudaSuccess) return err;
  if (plan.n == 0) return cudaSuccess;
  if (scores == nullptr || (kind == ScorerKind::kCriticalKV && critical == nullptr) ||
      scratch == nullptr || scratch_bytes < plan.scratch_bytes) {
    return cudaErrorInvalidValue;
  }
  char* base = static_cast<char*>(scratch);
  const int64_t items = static_cast<int64_t>(plan.num_kv_heads) * plan.n;
  float* norm = reinterpret_cast<float*>(base + plan.norm_offset);

  if (kind == ScorerKind::kExpectedAttention) {
    err = LaunchPrepareMats(plan, model.ea_cov, model.ea_mean, base, stream);
    if (err != cudaSuccess) return err;
    const QuadFastArgs qa = QuadArgsOf(plan, layer.keys, plan.n, base, layer.softmax_scale,
                                       model.half_scale2, norm);
    err = LaunchQuad(qa, plan.dtype, plan.padded_dim, plan.num_kv_heads, true, stream);
    if (err != cudaSuccess) return err;
    float2* qstats = reinterpret_cast<float2*>(base + plan.qstats_offset);
    EaStatsKernel<<<plan.num_query_heads, kStatsThreads, 0, stream>>>(norm, plan.n, qstats);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    EaScoreFastArgs sa{layer.values, norm,          qstats,     plan.n,          plan.num_kv_heads,
                       plan.group,   plan.head_dim, params.eps, params.use_vnorm, scores};
    const int64_t blocks = (items * 8 + 255) / 256;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    switch (plan.dtype) {
      case DType::kF32:
        EaScoreFastKernel<float><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(sa);
        break;
      case DType::kF16:
        EaScoreFastKernel<__half><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(sa);
        break;
      case DType::kBF16:
        EaScoreFastKernel<__nv_bfloat16><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(sa);
        break;
    }
    return cudaGetLastError();
  }

  float* pre = reinterpret_cast<float*>(base + plan.pre_offset);
  float* pooled = reinterpret_cast<float*>(base + plan.pooled_offset);
  if (plan.prefix > 0) {
    err = LaunchWindowRows(plan, layer, params, base, pre, stream);
    if (err != cudaSuccess) return err;
    err = LaunchPool1DStrided(pre, plan.n, plan.pre_rows, plan.prefix, params.kernel,
                              params.pool_max, pooled, plan.n, stream);
    if (err != cudaSuccess) return err;
    if (plan.l1) {
      const FastWoLayout wl = MakeFastWoLayout(plan.num_query_heads, plan.head_dim, model.hidden);
      L1FastArgs la{};
      la.values = layer.values;
      la.w16 = reinterpret_cast<const __half*>(static_cast<const char*>(fast_inputs.w_o16) +
                                               wl.header_bytes);
      la.w_inv = static_cast<const float*>(fast_inputs.w_o16);
      la.n = plan.n;
      la.count = plan.prefix;
      la.d = plan.head_dim;
      la.hidden = model.hidden;
      la.group = plan.group;
      la.out = norm;
      err = LaunchL1(la, plan.dtype, plan.padded_dim, plan.num_kv_heads, stream);
    } else {
      const bool summed = kind == ScorerKind::kLaProx && params.gqa == LaProxGqa::kSummedWo;
      err = LaunchPrepareMats(plan, summed ? model.group_gram : model.head_gram, nullptr, base,
                              stream);
      if (err != cudaSuccess) return err;
      const QuadFastArgs qa = QuadArgsOf(plan, layer.values, plan.prefix, base, 0.0f, 0.0f, norm);
      err = LaunchQuad(qa, plan.dtype, plan.padded_dim, plan.num_kv_heads, false, stream);
    }
    if (err != cudaSuccess) return err;
  }
  if (kind == ScorerKind::kCriticalKV) {
    CriticalCombineFast<<<ItemBlocks(items), 256, 0, stream>>>(
        pooled, norm, plan.n, plan.prefix, plan.num_kv_heads, plan.group, params.eps, scores,
        critical);
  } else {
    LaProxCombineFast<<<ItemBlocks(items), 256, 0, stream>>>(
        pooled, norm, plan.n, plan.prefix, plan.num_kv_heads, plan.group, params.gqa, scores);
  }
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu
