// Fast numerics on the CPU: Expected Attention's scores (baselines.md §7; canonical
// definition in kernels/cpu/scorers.h) from its query statistics, in fp32 with SIMD chosen at
// run time: the logits of every token (value_norms.h, FastExpectedLogits), each query head's
// softmax over them (maxima and sums of exp per tile of kFastTokenTile tokens, combined in
// tile order), the probabilities summed over the G query heads of a KV head, then eps and
// ||v||. Work items are (KV head, tile): the same bits on any thread count.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"
#include "kernels/expected_attention_stats.h"

namespace kvtrim {

/// scores [H_kv, n] = (mean_g p_{hG+g, j} + eps) * (use_vnorm ? ||v_{h,j}||_2 : 1), p_q the
/// softmax over every token of the logits of `stats` (mean [H_q, d], cov [H_q, d, d]).
void FastExpectedAttentionScores(const CpuLayer& layer, const ExpectedQueryStats& stats,
                                 float eps, bool use_vnorm, ThreadPool& pool, float* scores);

}  // namespace kvtrim
