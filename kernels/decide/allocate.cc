#include "kernels/decide/allocate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvtrim {

std::vector<int64_t> AllocateUniform(int64_t num_heads, int64_t k) {
  return std::vector<int64_t>(static_cast<size_t>(num_heads), k);
}

int64_t PyramidLayerBudget(int64_t k, int64_t n, int32_t layer, int32_t num_layers, double beta,
                           int64_t protected_tokens) {
  if (num_layers <= 1) return k;
  const double K = static_cast<double>(k);
  const double N = static_cast<double>(n);
  const double span = static_cast<double>(num_layers - 1);
  const double l = static_cast<double>(layer);
  const int64_t floor_tokens = std::max<int64_t>(1, protected_tokens);
  const bool last_unclamped = K >= static_cast<double>(floor_tokens) * beta;  // k/beta >= floor
  if (last_unclamped && (2.0 * K - N) * beta <= K) {
    // k_{L-1} = k/beta, k_0 = 2k - k/beta <= n. One rounding: the schedule as one fraction
    // x_l = (2k(L-1-l)beta + k(2l-(L-1))) / (beta(L-1)), so exact halves round up.
    const double budget = (2.0 * K * (span - l) * beta + K * (2.0 * l - span)) / (beta * span);
    return std::clamp<int64_t>(RoundHalfUp(budget), 1, n);
  }
  // Integer end points: the last layer raised to the protected tokens, or k_0 clamped to n
  // (kvpress), which moves the rest of 2k back to the last layer.
  int64_t last = last_unclamped ? 2 * k - n : floor_tokens;
  int64_t first = 2 * k - last;
  if (first > n) {
    first = n;
    last = 2 * k - n;
  }
  if (last < floor_tokens || first < last) return k;  // infeasible: uniform
  const double budget =
      (static_cast<double>(first) * (span - l) + static_cast<double>(last) * l) / span;
  return std::clamp<int64_t>(RoundHalfUp(budget), 1, n);
}

std::vector<int64_t> AllocateAdaKV(const float* scores, int64_t num_heads, int64_t n, int64_t k,
                                   double alpha) {
  const int64_t safeguard = std::min<int64_t>(
      n, static_cast<int64_t>(std::floor(alpha * static_cast<double>(k))));
  std::vector<int64_t> counts(static_cast<size_t>(num_heads), safeguard);
  const int64_t extra = num_heads * k - num_heads * safeguard;
  if (extra <= 0) return counts;
  // The safeguard takes each head's first `safeguard` tokens by (score desc, index asc), a
  // partial selection (O(n)); the remaining candidates compete in one flattened top-`extra`.
  struct Candidate {
    float score;
    int32_t token;
    int32_t head;
  };
  std::vector<Candidate> rest;
  rest.reserve(static_cast<size_t>(num_heads * (n - safeguard)));
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* s = scores + h * n;
    std::iota(order.begin(), order.end(), 0);
    if (safeguard > 0 && safeguard < n) {
      std::nth_element(order.begin(), order.begin() + (safeguard - 1), order.end(),
                       [s](int32_t a, int32_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
    }
    for (int64_t r = safeguard; r < n; ++r) {
      rest.push_back({s[order[r]], order[r], static_cast<int32_t>(h)});
    }
  }
  const int64_t take = std::min<int64_t>(extra, static_cast<int64_t>(rest.size()));
  auto better = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.token != b.token) return a.token < b.token;
    return a.head < b.head;
  };
  if (take < static_cast<int64_t>(rest.size())) {
    std::nth_element(rest.begin(), rest.begin() + (take - 1), rest.end(), better);
  }
  for (int64_t i = 0; i < take; ++i) ++counts[rest[i].head];
  return counts;
}

}  // namespace kvtrim
