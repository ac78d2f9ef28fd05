// Causal softmax attention of one window query row against one KV head, streamed per
// token: the shared core of the attention-based CPU scorers (SnapKV, H2O, TOVA, DropKV).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

#include "kernels/cpu/cpu_layer.h"

namespace kvtrim {

/// fp32 dot product of a[0..d) and b[0..d) with eight fixed partial sums, combined in a
/// fixed order: the same bits on every call and every thread.
float DotF32(const float* a, const float* b, int64_t d);

/// Number of tokens window row t of `layer` sees under the causal mask: the tokens
/// j <= n - w + t, i.e. clamp(n - w + t + 1, 0, n).
int64_t VisibleTokens(const CpuLayer& layer, int64_t t);

/// Checks that `layer` carries queries and that the last `window` rows exist
/// (1 <= window <= w): INVALID_ARGUMENT naming `scorer` otherwise.
absl::Status CheckQueryWindow(const char* scorer, const CpuLayer& layer, int64_t window);

/// The statistics of one attention row.
struct AttentionRowStats {
  int64_t visible = 0;  // tokens 0..visible-1 are seen; later tokens have p = 0
  double lse = 0;       // log sum_j exp(logit_j) over the visible tokens (-inf if none)
};

/// Computes the attention row of query head `q_head`, window row `t` (position n - w + t)
/// against its KV head q_head / G, with logit_j = softmax_scale * <q, k_j> (fp32 dot):
///   probs[0..n)  [n] fp32: p_j = exp(logit_j - lse) (evaluated in double, stored as fp32)
///                for j < visible, 0 for the masked tokens j >= visible;
///   output[0..d) [d] fp32, optional (nullptr = skip): a = sum_j p_j v_j, accumulated in
///                double in token order (requires values); zero when no token is visible.
/// The LSE is accumulated in double in token order. Scratch is O(d); no allocation of
/// any [w, n] or [n, d] temporary. Deterministic.
AttentionRowStats ComputeAttentionRow(const CpuLayer& layer, int64_t q_head, int64_t t,
                                      float* probs, float* output);

}  // namespace kvtrim
