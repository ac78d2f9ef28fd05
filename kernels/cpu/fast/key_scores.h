// Fast numerics on the CPU for the key-only scorers (baselines.md §8 K-norm, keydiff.md §2.2
// KeyDiff): fp32 SIMD chosen at run time (tile_ops-inl.h), keys read as they arrived a tile
// at a time (token_rows.h), work split over (KV head, key tile) pairs with fixed bounds and
// fixed reduction orders, so the same bits on any thread count.
//   key norms: norm[h, j] = sqrt(|k_j|^2)   (K-norm's score is its negation)
//   KeyDiff: a = (1/n) sum_j u_j (u_j = k_j / |k_j|, or k_j for raw_mean), summed per tile
//            in fp32 and over the tiles in fp64, in order;
//            score[h, j] = -(k_j . a) / max(|k_j| |a|, eps)  (0 where that is 0)
#pragma once

#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/keydiff_block.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// The key norms [H_kv, n] of `layer` (definition above).
void FastKeyNorms(const CpuLayer& layer, ThreadPool& pool, float* norms /*[H_kv, n]*/);

/// KeyDiff scores [H_kv, n] of `layer` (definition above).
void FastKeyDiffScores(const CpuLayer& layer, KeyDiffAnchor anchor, float eps, ThreadPool& pool,
                       float* scores /*[H_kv, n]*/);

}  // namespace kvtrim
