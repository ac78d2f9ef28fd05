// Fast numerics on the CPU: the window statistics of the model-aware scorers (CriticalKV,
// LaProx), reduced over the window rows per prefix token, in fp32 with SIMD chosen at run
// time. Notation of kernels/cpu/scorers.h: p_{q,t,j} is query head q's causal softmax at
// window row t over token j (0 where the row does not see j); the rows t are the last
// `window` rows sent; P = `prefix` tokens are reduced.
//
// The rows of each KV head are cut into blocks of 16 or 32 (row_attention.h, RowBlockSoftmax:
// logits per key tile, tile maxima combined in order, one exp per row and token); a block's
// probabilities are reduced per tile over the rows of each segment (a query head's rows, or
// one window row's G query heads), each block into its own partial sums, and the blocks'
// partials added in block order: the same bits on any thread count.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Which statistic of the window rows FastWindowColumns computes per prefix token.
enum class WindowReduction {
  kSumPerHead,        // out [H_q, P]:  sum_t p_{q,t,j}           (CriticalKV's mean * window)
  kSquaresPerHead,    // out [H_q, P]:  sum_t p_{q,t,j}^2         (LaProx head_bound)
  kGroupSumSquares,   // out [H_kv, P]: sum_t (sum_g p_{hG+g,t,j})^2  (LaProx mean: G^2 m_t^2)
};

/// Writes the `reduction` of the last `window` window rows of `layer` (which carries queries,
/// 1 <= window <= w) for the tokens j < prefix (0 < prefix < n) into out (shape above).
void FastWindowColumns(const CpuLayer& layer, int64_t window, int64_t prefix,
                       WindowReduction reduction, ThreadPool& pool, float* out);

}  // namespace kvtrim
