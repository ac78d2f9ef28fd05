// Canonical window attention on the CPU: the shared core of the attention-based scorers
// (SnapKV, H2O, TOVA, DropKV) as kernels/canonical_attention.h defines it, row by row.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/canonical_attention.h"
#include "kernels/canonical_math.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/pooling.h"
#include "kernels/params.h"

namespace kvtrim {

/// Number of tokens window row t of `layer` sees under the causal mask: the tokens
/// j <= n - w + t, i.e. clamp(n - w + t + 1, 0, n).
int64_t VisibleTokens(const CpuLayer& layer, int64_t t);


/// The statistics of one canonical attention row (step 3).
struct AttentionRowStats {
  int64_t visible = 0;   // V: tokens 0..V-1 are seen; later tokens have p = 0
  float neg_max = 0;     // -M (unused when V = 0)
  float inv_sum = 0;     // 1/Z (unused when V = 0)
};

/// Per-thread scratch of ComputeAttentionRow, reused across rows (grows on demand).
struct AttentionRowScratch {
  std::vector<float> logits;    // [n] l_j of the current row
  std::vector<float> exps;      // [S] e_j of the current segment
  std::vector<float> seg_max;   // [segments] m_s
  std::vector<float> seg_sum;   // [segments] z_s, then the scaled terms
  std::vector<float> seg_out;   // [segments, d] o_s, then the scaled terms
  std::vector<float> chunk_sum; // [chunks per segment] z_c
  std::vector<float> chunk_out; // [chunks per segment, d] o_c
};

/// Computes the canonical row of query head `q_head`, window row `t` (steps 1-3): fills
/// scratch->logits[0..V) with the logits l_j and returns V, -M and 1/Z. When `output` is not
/// nullptr (requires values) also writes the attention output a [d] fp32 (zero when V = 0).
/// Probabilities follow from CanonicalProb(scratch->logits[j], stats.neg_max, stats.inv_sum).
/// Scratch is O(n + (n / S) d); no [w, n] or [n, d] temporary. Deterministic.
AttentionRowStats ComputeAttentionRow(const CpuLayer& layer, int64_t q_head, int64_t t,
                                      float* output, AttentionRowScratch* scratch);

/// CmTreeSum applied column-wise to `m` rows of `width` floats at x [m, width] (clobbered):
/// on return row 0 holds, for every column, exactly CmTreeSum of that column.
void TreeSumRows(float* x, int64_t m, int64_t width);

}  // namespace kvtrim
