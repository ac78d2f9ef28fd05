// fp64 brute-force references for selection and budget allocation (specs/README.md rules
// 1, 4, 5; specs/baselines.md §4, §5). Written independently of kernels/: full sorts and
// literal readings of the rules, no shortcuts. For tests only.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::oracle {

/// All token indices of `scores` [n] by descending score, equal scores by ascending index
/// (rule 1). +inf and -inf are ordinary values; NaN is not allowed.
std::vector<int64_t> RankByScore(const std::vector<double>& scores);

/// The `count` highest scores of `scores` [n] (ties to the lower index), ascending indices.
std::vector<int64_t> TopKByRank(const std::vector<double>& scores, int64_t count);

/// Head-shared round-robin: scores [H][n]; walks rank 0 of heads 0..H-1, then rank 1, ...,
/// adding tokens not yet in the list until it holds `count` (or every token). Ascending.
std::vector<int64_t> SharedRoundRobin(const std::vector<std::vector<double>>& scores,
                                      int64_t count);

/// The outcome of AdaKV for one layer: per-head counts and kept index lists.
struct AdaKVResult {
  std::vector<int64_t> counts;             // [H]
  std::vector<std::vector<int64_t>> kept;  // [H][counts[h]] ascending token indices
};

/// AdaKV (rule 4), literally: scores [H][n] with protected tokens already +inf, per-head
/// budget k <= n. Step 1 (safeguard): each head keeps its own top floor(alpha*k) (double).
/// Step 2: every not-yet-kept (head, token) pair is sorted by score descending, then token
/// ascending, then head ascending, and the first H*k - H*floor(alpha*k) are kept.
AdaKVResult AdaKV(const std::vector<std::vector<double>>& scores, int64_t k, double alpha);

/// PyramidKV (rule 5, baselines §4) per-head count of layer `layer` of `num_layers`, from the
/// per-head total k (protected tokens included), context length n, beta > 1, evaluated in
/// EXACT rational arithmetic (beta taken as the exact value of its double). With
/// F = max(1, protected):
///   k_{L-1} = max(k/beta, F), k_0 = 2k - k_{L-1}   (rule 5: every layer keeps the window);
///   if k_0 > n: k_0 = n, k_{L-1} = 2k - n           (kvpress clamp);
///   if L == 1, k_{L-1} < F or k_0 < k_{L-1}: uniform k (rule 5's infeasible fallback);
///   else k_l = floor(x_l + 1/2) (rule 6, round half up) with the exact
///        x_l = k_0 - l (k_0 - k_{L-1}) / (L-1).
/// So a schedule value that is mathematically m + 1/2 always rounds up to m + 1, whatever
/// order a double implementation would evaluate it in.
int64_t PyramidLayerBudget(int64_t k, int64_t n, int32_t layer, int32_t num_layers, double beta,
                           int64_t protected_tokens);

}  // namespace kvtrim::oracle
