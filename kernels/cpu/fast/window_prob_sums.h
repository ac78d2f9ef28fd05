// Fast numerics on the CPU (design.md "Numerics"): the window attention probability sums of
// SnapKV, H2O and TOVA, in fp32 with SIMD chosen at run time (Highway: AVX-512, AVX2, SSE4,
// SSSE3 or scalar code, the best the CPU has; the build assumes none of them).
//
// For KV head h and the window rows t in [first_row, w) of its G query heads q = hG + g:
//   l_{r,j} = scale * (q_r . k_j)                      r = (g, t), j < V_r (causal mask)
//   p_{r,j} = exp(l_{r,j} - M_r) / Z_r                 M_r = max_j l, Z_r = sum_j exp(l - M_r)
//   sums[h, j] = sum_r p_{r,j}                         (0 where no row sees j)
// Keys are read in tiles of kFastTokenTile tokens; a row's maximum and sum of exp are found
// per tile and the tiles' partials combined in tile order, then the probabilities are added
// per token. Never a [G * w, n] matrix; the logits of a tile are computed once or twice:
//  - a few rows (TOVA's G <= 8): dot products over d, kept between the two steps ([G, n]);
//  - up to 64K tokens: per (KV head, block of 32 rows) a slab [n, 32] of logits per thread,
//    computed once (the keys read once per block);
//  - longer: two passes over the key tiles, the logits recomputed in the second.
// A tile's logits for a block of rows are a register-blocked product of the keys with the
// transposed, scaled query rows (fused multiply-add, vectorised over rows); exp is
// Highway's vectorised exp. Work items are (head, tile)
// pairs with fixed bounds, so the sums are the same bits whatever the thread count. Error
// against the canonical arithmetic: docs/numerics.md, "Fast numerics on the CPU".
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Writes sums [H_kv, n] (definition above) for the window rows [first_row, w) of `layer`,
/// which must carry queries, with 0 <= first_row < w.
void FastWindowProbSums(const CpuLayer& layer, int64_t first_row, ThreadPool& pool,
                        float* sums /*[H_kv, n]*/);

}  // namespace kvtrim
