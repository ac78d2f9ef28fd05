// Fast numerics on the CPU (design.md "Numerics"): DropKV's eviction cost before its group
// mean and pooling, in fp32 with SIMD chosen at run time (the instruction sets of
// window_prob_sums.h).
//
// For KV head h and the last `window` rows t of its G query heads q = hG + g (r = (g, t)):
//   p_{r,j}  = softmax_j(scale * q_r . k_j) over the tokens j < V_r row r sees
//   a_r      = sum_j p_{r,j} v_j                                   (the row's output)
//   cost[h, j] = sum_{r: j < V_r} omega(p~_{r,j}) * max(0, |a_r|^2 + |v_j|^2 - 2 a_r . v_j)
//   omega(p) = (p / (1 - p + eps))^2, p~ = p rounded to bf16 when `round_bf16`, else p.
// Three products per block of up to 32 rows, each a register-blocked SIMD matrix product
// over tiles of kFastTokenTile keys: Q.K^T (the logits; kept in a per-thread slab [n, 32]
// up to 64K tokens, else recomputed in each sweep), P.V (the outputs a, summed per tile in
// registers, then over the tiles in order) and A.V^T (a_r . v_j). Work items are (KV head,
// row block) pairs whose costs are added in block order: the same bits on any thread count.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Writes cost [H_kv, n] (definition above) for the last `window` rows of `layer`, which
/// must carry values and at least `window` >= 1 query rows; and, when `row_outputs` is not
/// null, the rows' outputs a_r into it [H_kv, G * window, d] (row r = g * window + t - (w -
/// window)), which the perturbation statistic can reuse.
void FastDropKVCost(const CpuLayer& layer, int64_t window, float eps, bool round_bf16,
                    ThreadPool& pool, float* cost /*[H_kv, n]*/, float* row_outputs = nullptr);

}  // namespace kvtrim
