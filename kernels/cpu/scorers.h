// CPU scorers: one retention score per (KV head, token), higher = keep.
// Every function writes scores [H_kv, n] fp32 row-major into `scores` and must be
// deterministic (the same inputs give the same bits, whatever the thread count).
// Protection (sink/recent = +inf) is applied afterwards by the backend, not here.
#pragma once

#include "absl/status/status.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/params.h"

namespace kvtrim {

/// StreamingLLM (baselines §1): score_j = j (newer is better); sinks come from protection.
absl::Status ScoreStreamingLlm(const CpuLayer& layer, const ResolvedParams& params,
                               ThreadPool& pool, float* scores);
/// Random (baselines §9): U[0,1) from a counter hash of (seed, layer, head, token).
absl::Status ScoreRandom(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores);
/// K-norm (baselines §8): score_j = -||k_j||_2.
absl::Status ScoreKnorm(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                        float* scores);
/// KeyDiff (keydiff.md §2.2): score_j = -cos(k_j, anchor).
absl::Status ScoreKeyDiff(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                          float* scores);
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
/// DropKV (dropkv.md §2): pooled eviction cost sum_t (p/(1-p))^2 ||a - v_j||^2, GQA-mean.
absl::Status ScoreDropKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores);

}  // namespace kvtrim
