// Per-head loss curves of LU-KV (lukv.md §3-§4): raw curve f, relaxed curve f̆, the oracle
// ordering and the optimality gap Δ(π, b).
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::lukv {

/// Token indices sorted by descending score, equal scores by ascending index (stable):
/// scores [n] -> order [n]. +inf (protected) tokens come first, by position.
std::vector<int32_t> DescendingOrder(const float* scores, int64_t n);
/// The same for double scores (the oracle ordering π* of an importance vector).
std::vector<int32_t> DescendingOrder(const double* scores, int64_t n);

/// Raw gains along an ordering: d [T] with d[i-1] = importance[order[i-1]].
std::vector<double> OrderedGains(const double* importance, const std::vector<int32_t>& order);

/// Raw loss curve f [T+1] of gains d [T]: f(i) = Σ_{m>i} d(m), the importance of the tokens
/// evicted when the first i are kept. Suffix sums make f(T) = 0 and f non-increasing exactly.
std::vector<double> RawLossCurve(const std::vector<double>& d);

/// Relaxed curve f̆ [T+1] from f(0) and hull gains ĝ [T]: f̆(i) = f(0) - Σ_{m<=i} ĝ(m).
std::vector<double> SurrogateCurve(double f0, const std::vector<double>& g);

/// Eq. 7 for budget b: miss = O \ P, fp = P \ O with P, O the top-b prefixes of `order_pi`
/// and `order_star`; delta = Σ_{miss} I - Σ_{fp} I = 𝓛(P) - 𝓛(O).
struct GapResult {
  double delta = 0;
  int64_t num_miss = 0;
  int64_t num_fp = 0;
};

/// The optimality gap of ordering `order_pi` against `order_star` at budget b over
/// importance [T] (both orders are permutations of 0..T-1).
GapResult OptimalityGap(const std::vector<double>& importance, const std::vector<int32_t>& order_pi,
                        const std::vector<int32_t>& order_star, int64_t b);

}  // namespace kvtrim::lukv
