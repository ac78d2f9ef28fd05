// Fast numerics on the CPU: the output perturbation statistic of kernels/cpu/perturbation.h
// (the mean over window rows of ||a_kept - a_full||_2 / ||a_full||_2), with the full and the
// kept attention outputs in fp32 SIMD (row_attention.h) and the per-row ratios and their
// mean in fp64. The kept outputs come from a run over the kept tokens only, gathered from
// the head's list (the softmax with its own maximum, as in the definition), so they cost
// about the kept fraction of the full run.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// OutputPerturbation's statistic over the last `rows_per_head` window rows of every query
/// head (all w rows: the full statistic; fewer: the sampled one), out [H_kv]. Kept lists as
/// OutputPerturbation takes them (one shared list when `offsets` has 2 entries).
/// `full_outputs`, when not null, are the rows' full outputs a scorer already computed
/// [H_kv, G * rows_per_head, d] (row r = g * rows_per_head + t - (w - rows_per_head), as
/// FastDropKVCost writes them): the full run is skipped and they are taken as they are.
void FastOutputPerturbation(const CpuLayer& layer, const std::vector<int64_t>& offsets,
                            const std::vector<int32_t>& kept, int64_t rows_per_head,
                            ThreadPool& pool, double* out /*[H_kv]*/,
                            const float* full_outputs = nullptr);

}  // namespace kvtrim
