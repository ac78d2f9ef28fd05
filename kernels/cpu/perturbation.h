// The exact relative output perturbation of a kept set on the observation window.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// For each KV head h with kept list kept[offsets[h] : offsets[h+1]] (ascending token
/// indices; when `offsets` has 2 entries one list serves every head), computes the mean
/// over the G query heads of its group and the w window rows of
///   ||a_kept - a_full||_2 / ||a_full||_2,
/// where a_full is the causal softmax attention output over all tokens j <= n - w + t and
/// a_kept renormalises the softmax over the kept tokens among them. A row that sees no
/// kept token contributes 1 (a_kept = 0); a row with a_full = 0 contributes 0 when
/// a_kept = 0 too, else 1. Requires values and queries. Writes out[H_kv]. fp64 accumulation.
void OutputPerturbation(const CpuLayer& layer, const std::vector<int64_t>& offsets,
                        const std::vector<int32_t>& kept, ThreadPool& pool, double* out);

}  // namespace kvtrim
