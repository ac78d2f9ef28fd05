#include "kernels/decide/lukv_budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvtrim {

double LukvEvictedRatio(const Budget& budget, int64_t n) {
  if (budget.by_fraction) return 1.0 - budget.keep_fraction;
  return 1.0 - static_cast<double>(std::min(budget.keep_tokens, n)) / static_cast<double>(n);
}

std::vector<int64_t> LukvHeadBudgets(const LukvProfile& profile, int64_t num_layers,
                                     int64_t num_kv_heads, int64_t layer, int64_t n,
                                     double sigma, bool interpolate) {
  const int64_t last = kLukvProfileRows - 1;
  std::vector<double> ratio(static_cast<size_t>(num_kv_heads));
  if (interpolate) {
    const double x = std::clamp(100.0 * sigma - 1.0, 0.0, static_cast<double>(last));
    const int64_t lo = std::min<int64_t>(static_cast<int64_t>(std::floor(x)), last);
    const int64_t hi = std::min<int64_t>(lo + 1, last);
    const double t = x - static_cast<double>(lo);
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      ratio[h] = (1.0 - t) * profile.ratio(lo, layer, h, num_layers, num_kv_heads) +
                 t * profile.ratio(hi, layer, h, num_layers, num_kv_heads);
    }
  } else {
    const int64_t row = std::clamp<int64_t>(RoundHalfUp(100.0 * sigma) - 1, 0, last);
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      ratio[h] = profile.ratio(row, layer, h, num_layers, num_kv_heads);
    }
  }
  std::vector<double> ideal(static_cast<size_t>(num_kv_heads));
  std::vector<int64_t> counts(static_cast<size_t>(num_kv_heads));
  double ideal_sum = 0;
  int64_t floor_sum = 0;
  for (int64_t h = 0; h < num_kv_heads; ++h) {
    ideal[h] = (1.0 - ratio[h]) * static_cast<double>(n);
    counts[h] = static_cast<int64_t>(std::floor(ideal[h]));
    ideal_sum += ideal[h];
    floor_sum += counts[h];
  }
  int64_t remainder = RoundHalfUp(ideal_sum) - floor_sum;
  std::vector<int64_t> order(static_cast<size_t>(num_kv_heads));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ideal[a] - std::floor(ideal[a]) > ideal[b] - std::floor(ideal[b]);
  });
  for (int64_t i = 0; i < num_kv_heads && remainder > 0; ++i, --remainder) ++counts[order[i]];
  for (auto& c : counts) c = std::clamp<int64_t>(c, 1, n);
  return counts;
}

}  // namespace kvtrim
