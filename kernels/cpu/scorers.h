// The CPU scorers' functions: one retention score per (KV head, token), higher = keep. The
// window-attention scorers are table scorers (kernels/cpu/scorers/, one file each, reached
// through kernels/cpu/cpu_scorer_table.h), declared here for the tests and tools that call
// them directly; the model scorers follow.
// Every function writes scores [H_kv, n] fp32 row-major into `scores` and must be
// deterministic (the same inputs give the same bits, whatever the thread count).
// Protection (sink/recent = +inf) is applied afterwards by the backend, not here.
// Validated once: every function takes a layer and parameters that passed PolicyEngine::Validate
// (the inputs the scorer requires are present, and its ScorerSpec::validate accepted the
// parameters with the layer's shape: window <= rows sent, odd kernel) and does not check
// them again; a direct caller (tests, the LU-KV profiler) runs the same validate first.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/cpu_scorer_table.h"  // FastRowOutputs
#include "kernels/thread_pool.h"
#include "kernels/model.h"
#include "kernels/params.h"

namespace kvtrim {

/// SnapKV (baselines §3): pooled window attention, GQA-mean.
absl::Status ScoreSnapKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores);
/// H2O (baselines §2): accumulated attention over all window rows, GQA-mean.
absl::Status ScoreH2O(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                      float* scores);
/// TOVA (baselines §6): last query row's attention averaged over all query heads of the
/// layer; the same score in every KV head.
absl::Status ScoreTova(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                       float* scores);
/// Fast numerics (design.md "Numerics"; docs/numerics.md "Fast numerics on the CPU") of
/// SnapKV, H2O and TOVA: the same definitions with the window probability sums of
/// FastWindowProbSums (fp32, SIMD chosen at run time) in place of the canonical rows.
absl::Status ScoreSnapKVFast(const CpuLayer& layer, const ResolvedParams& params,
                             ThreadPool& pool, float* scores);
absl::Status ScoreH2OFast(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                          float* scores);
absl::Status ScoreTovaFast(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                           float* scores);
/// DropKV (dropkv.md §2): pooled eviction cost sum_t (p/(1-p))^2 ||a - v_j||^2, GQA-mean.
absl::Status ScoreDropKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores);
/// DropKV in fast numerics: the cost of FastDropKVCost (kernels/cpu/fast/dropkv_cost.h),
/// then the same group mean and pooling.
absl::Status ScoreDropKVFast(const CpuLayer& layer, const ResolvedParams& params,
                             ThreadPool& pool, float* scores);
/// ScoreDropKVFast that also keeps its window rows' outputs in *rows (for the perturbation
/// statistic over the same rows).
absl::Status ScoreDropKVFastWithRows(const CpuLayer& layer, const ResolvedParams& params,
                                     ThreadPool& pool, float* scores, FastRowOutputs* rows);


// ===================== MODEL-AWARE SCORERS (canonical definitions) =====================
// Notation of window_attention.h; p_{q,t,j} = CanonicalProb of query head q, window row t,
// token j (0 for masked tokens). P = n - window (the prefix; tokens j >= P score 0 and are
// protected by the default window protection). CmChunkedSum (canonical_math.h) = seq sums
// of 64-element chunks, then CmTreeSum over the chunk sums. Rows t run over the LAST
// `window` rows, in increasing t. G = H_q / H_kv, query head q = h*G + g.
//
// CriticalKV (criticalkv.md §2), KV head h, j < P:
//   mean_q[j]  = CmDiv(seq_t p_{q,t,j}, window)                       (per query head q)
//   pooled_q   = Pool1D(pooling, mean_q[0..P), kernel)                (pool BEFORE group mean)
//   attention[h,j] = CmDiv(seq_g pooled_{hG+g}[j], G)
//   norm l1: n_q[j] = CmChunkedSum_{e < D} |CmDot(v_{h,j}, w_o[e, q*d : q*d+d], d)|
//   norm l2: y[i] = CmDot(head_gram_q[i, :], v_{h,j}, d); n_q[j] = CmSqrt(max(0, CmDot(v, y, d)))
//   norm[h,j]  = CmDiv(seq_g n_{hG+g}[j], G)
//   critical[h,j] = CmMul(CmAdd(attention[h,j], eps), norm[h,j]);   both 0 for j >= P.
//
// LaProx (laprox.md §2.1), KV head h, j < P:
//   gqa=mean:       col[j] = CmSqrt(seq_t sq_t), sq_t = CmMul(m_t, m_t),
//                   m_t = CmDiv(seq_g p_{hG+g,t,j}, G);  a = Pool1D(pooling, col[0..P), kernel)
//                   m[j] = CmDiv(seq_g CmSqrt(max(0, CmDot(v, Gram_{hG+g} v, d))), G)
//                   score = CmMul(a[j], m[j])
//   gqa=head_bound: col_q[j] = CmSqrt(seq_t CmMul(p_{q,t,j}, p_{q,t,j})); a_q = Pool1D(col_q)
//                   score = CmDiv(seq_g CmMul(a_{hG+g}[j], CmSqrt(max(0, v Gram_{hG+g} v))), G)
//   gqa=summed_wo:  score = CmMul(a[j], CmSqrt(max(0, CmDot(v, GroupGram_h v, d))))
//   (Gram v means y[i] = CmDot(Gram[i, :], v, d); v Gram v = CmDot(v, y, d).)
//
// Expected Attention (baselines.md §7): per query head q, mu_q [d] and Sigma_q [d, d] fp32 from
// ComputeExpectedQueryStats (host, double, kernels/expected_attention_stats.h); for every
// token j < n:
//   lin = CmDot(mu_q, k_{h,j}, d); y[i] = CmDot(Sigma_q[i, :], k_{h,j}, d); quad = CmDot(k, y, d)
//   l_j = CmAdd(CmMul(lin, scale), CmMul(quad, half_scale2))
//   M = max_j l_j; e_j = CmExp(CmAdd(l_j, -M)); Z = CmChunkedSum(e, n); inv = CmDiv(1, Z)
//   p_{q,j} = CmMul(e_j, inv);  ea[h,j] = CmDiv(seq_g p_{hG+g,j}, G)
//   score = use_vnorm ? CmMul(CmAdd(ea, eps), CmSqrt(CmDot(v_j, v_j, d))) : CmAdd(ea, eps)
// ==========================================================================================

/// CriticalKV: writes attention [H_kv, n] (stage 1 and allocation) and critical [H_kv, n]
/// (stage 2). Needs the model's w_o (l1) or head_gram (l2) of layer.layer_id.
absl::Status ScoreCriticalKV(const CpuLayer& layer, const ResolvedParams& params,
                             const RegisteredModel& model, ThreadPool& pool, float* attention,
                             float* critical);
/// LaProx: writes the unnormalised score p [H_kv, n] (0 on the window).
absl::Status ScoreLaProx(const CpuLayer& layer, const ResolvedParams& params,
                         const RegisteredModel& model, ThreadPool& pool, float* scores);
/// Expected Attention: writes scores [H_kv, n].
absl::Status ScoreExpectedAttention(const CpuLayer& layer, const ResolvedParams& params,
                                    const RegisteredModel& model, ThreadPool& pool,
                                    float* scores);

/// Fast numerics (docs/numerics.md "Fast numerics on the CPU") of the model-aware scorers:
/// the same definitions in fp32 SIMD, with the window statistics of FastWindowColumns
/// (kernels/cpu/fast/window_columns.h), the projected norms and Expected Attention's logits of
/// kernels/cpu/fast/value_norms.h, and the exact pooling (Pool1D).
absl::Status ScoreCriticalKVFast(const CpuLayer& layer, const ResolvedParams& params,
                                 const RegisteredModel& model, ThreadPool& pool, float* attention,
                                 float* critical);
absl::Status ScoreLaProxFast(const CpuLayer& layer, const ResolvedParams& params,
                             const RegisteredModel& model, ThreadPool& pool, float* scores);
absl::Status ScoreExpectedAttentionFast(const CpuLayer& layer, const ResolvedParams& params,
                                        const RegisteredModel& model, ThreadPool& pool,
                                        float* scores);

}  // namespace kvtrim
