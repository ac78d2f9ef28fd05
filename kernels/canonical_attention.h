// Canonical window attention: the shared core of the attention-based scorers (SnapKV, H2O,
// TOVA, DropKV). The CPU backend (kernels/cpu/window_attention.h) and the GPU backend
// (kernels/gpu/kernels/attention_*) both implement exactly this definition, so for fp32 inputs
// (and f16/bf16 inputs, which convert to fp32 exactly) their scores are bit-identical. This
// header holds the definition and the pieces both backends share (host and device).
//
// ================================ THE CANONICAL ALGORITHM ================================
// Every float operation below is one of canonical_math.h: CmAdd, CmMul, CmDiv, CmExp, CmDot,
// CmTreeSum (no fused multiply-add, no other rounding). "seq" = a left-to-right CmAdd chain
// starting from +0.0f; "tree" = CmTreeSum in the stated order; "max" = the exact maximum
// (order-free). Constants: C = kAttnChunk = 64 tokens, S = kAttnSegment = 512 tokens (8 chunks).
//
// A row r is one window query: query head q (KV head h = q / G), window row t at position
// n - w + t. It sees the tokens j < V_r = clamp(n - w + t + 1, 0, n) (causal mask).
//  1. logit   l_j = CmMul(CmDot(q_r, k_{h,j}, d), scale)                         j < V_r
//  2. segments s = 0 .. ceil(V_r / S) - 1 cover [sS, min(sS + S, V_r)); chunks of C tokens
//     inside a segment start at multiples of C (the last chunk of a row may be short).
//     m_s     = max_{j in s} l_j
//     e_j     = CmExp(CmAdd(l_j, -m_s))                                           j in s
//     z_c     = seq_{j in c} e_j                 o_c[i] = seq_{j in c} CmMul(e_j, v_j[i])
//     z_s     = tree_{c in s, in order} z_c      o_s[i] = tree_{c in s, in order} o_c[i]
//  3. row     M = max_s m_s,   f_s = CmExp(CmAdd(m_s, -M))
//     Z       = tree_s CmMul(z_s, f_s)           inv = CmDiv(1, Z)
//     a[i]    = CmDiv(tree_s CmMul(o_s[i], f_s), Z)       (only when values are needed)
//     |a|^2   = CmDot(a, a, d)
//  4. prob    p_j = CmMul(CmExp(CmAdd(l_j, -M)), inv)   for j < V_r; p_j = 0 (not summed)
//              for j >= V_r. A row with V_r = 0 contributes nothing (a = 0).
//  5. per-token sums over rows run seq in the scorer's row order (never reassociated):
//     SnapKV  acc_j = seq_{g < G} seq_{t in window} p;       pre_j = CmDiv(acc_j, G*window)
//             (only j < P = n - window is used)
//     H2O     acc_j = seq_{g < G} seq_{t < w} p;             pre_j = CmDiv(acc_j, G*rows_j)
//             (rows_j = 1, or with causal_normalize the rows that see j; 0 rows -> 0)
//     TOVA    s_{h,j} = seq_{g < G} p (row t = w-1);  acc_j = seq_{h < H_kv} s_{h,j};
//             score_j = CmDiv(acc_j, H_q), the same in every KV head
//     DropKV  p~ = RoundToBf16(p) if bf16 rounding else p;
//             omega = CmMul(ratio, ratio), ratio = CmDiv(p~, CmAdd(CmAdd(1, -p~), eps));
//             vv_j = CmDot(v_j, v_j, d); av = CmDot(a, v_j, d);
//             delta2 = max(0, CmAdd(CmAdd(|a|^2, vv_j), -CmMul(2, av)));
//             cost_j = seq_{g < G} seq_{t in window} (delta2 > 0 ? CmMul(omega, delta2) : 0);
//             pre_j = CmDiv(cost_j, G)
//     (integers are converted to float exactly; adding a +0 term changes no bit, so a
//     masked token may be skipped or added as 0.)
//  6. pooling of pre: DropKV Pool1D (cpu/pooling.h) over all n tokens; SnapKV PoolPrefix
//     (cpu/pooling.h) over the prefix j < P = n - window only, the window tokens taking the
//     largest pooled prefix score. Max is exact; avg is a double
//     sum over the clipped window in index order, divided by the kernel in double, rounded
//     once to float (IEEE double add/div, reproducible on both backends).
// The GPU streams K/V in tiles (never a [w, n] matrix): step 2 needs only one segment's
// logits at a time, step 3 combines per-segment partials, step 4 recomputes the logit.
// ==========================================================================================
#pragma once

#include <cstdint>

#include "kernels/canonical_math.h"

namespace kvtrim {

/// Tokens per chunk of a canonical attention row (sequential sums inside a chunk).
constexpr int64_t kAttnChunk = kCanonicalChunk;
/// Tokens per segment of a canonical attention row (one local maximum per segment).
constexpr int64_t kAttnSegment = 512;
static_assert(kAttnSegment % kAttnChunk == 0, "a segment is a whole number of chunks");
/// Chunks per full segment.
constexpr int kAttnChunksPerSegment = static_cast<int>(kAttnSegment / kAttnChunk);

/// Streaming form of CmTreeSum: Push(x_0) ... Push(x_{m-1}) then Sum() returns exactly
/// CmTreeSum(x, m) (the same pairs, the same order) with O(log m) state. Holds up to
/// 2^kLevels - 1 values. Host and device.
template <int kLevels>
struct TreeAccumulator {
  float level[kLevels];  // level[k]: the tree sum of 2^k consecutive values, if occupied
  uint32_t count = 0;    // values pushed; bit k set = level[k] occupied

  /// Appends x as the next value.
  KVTRIM_HD void Push(float x) {
    bool placed = false;
    KVTRIM_UNROLL
    for (int k = 0; k < kLevels; ++k) {
      if (!placed) {
        if (count & (1u << k)) {
          x = CmAdd(level[k], x);  // earlier subtree on the left, as in CmTreeSum
        } else {
          level[k] = x;
          placed = true;
        }
      }
    }
    ++count;
  }

  /// The tree sum of everything pushed (0 when nothing was).
  KVTRIM_HD float Sum() const {
    float acc = 0.0f;
    bool any = false;
    KVTRIM_UNROLL
    for (int k = 0; k < kLevels; ++k) {
      if (count & (1u << k)) {
        acc = any ? CmAdd(level[k], acc) : level[k];
        any = true;
      }
    }
    return acc;
  }
};

/// Canonical probability (step 4) of a visible token from its logit and the row's -M, 1/Z.
KVTRIM_HD float CanonicalProb(float logit, float neg_max, float inv_sum) {
  return CmMul(CmExp(CmAdd(logit, neg_max)), inv_sum);
}

/// DropKV's per-(row, token) term (step 5): the weight omega times the clamped squared
/// distance, or 0 when the distance is not positive (0 * inf guard when eps == 0).
KVTRIM_HD float DropKVTerm(float p, float eps, float aa, float vv, float av) {
  const float ratio = CmDiv(p, CmAdd(CmAdd(1.0f, -p), eps));
  const float omega = CmMul(ratio, ratio);
  const float raw = CmAdd(CmAdd(aa, vv), -CmMul(2.0f, av));
  const float delta2 = 0.0f < raw ? raw : 0.0f;
  return delta2 > 0.0f ? CmMul(omega, delta2) : 0.0f;
}

}  // namespace kvtrim
