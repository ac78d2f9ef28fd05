// Allocators: how many tokens each KV head of a layer keeps.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/budget.h"

namespace kvtrim {

/// Uniform: every head keeps k.
std::vector<int64_t> AllocateUniform(int64_t num_heads, int64_t k);

/// PyramidKV (baselines §4, rule 5): per-layer count from the linear schedule over the
/// per-head total k (protected tokens included), beta > 1, L layers:
/// k_{L-1} = max(k/beta, max(1, protected)), k_0 = 2k - k_{L-1}; if k_0 > n then k_0 = n
/// and k_{L-1} = 2k - n; falls back to uniform k when that leaves k_{L-1} below
/// max(1, protected) or k_0 below k_{L-1} (only when protected > k, which rule 3 excludes).
/// k_l interpolates linearly, rounded half up. Every head of the layer keeps the returned
/// count.
int64_t PyramidLayerBudget(int64_t k, int64_t n, int32_t layer, int32_t num_layers, double beta,
                           int64_t protected_tokens);

/// AdaKV (rule 4): scores [num_heads, n] with protected tokens already +inf. Each head keeps
/// its top floor(alpha*k); the rest of num_heads*k goes to one top-k over the remaining
/// scores of all heads (ties: lower token index, then lower head). Returns counts [H].
std::vector<int64_t> AllocateAdaKV(const float* scores, int64_t num_heads, int64_t n, int64_t k,
                                   double alpha);

}  // namespace kvtrim
