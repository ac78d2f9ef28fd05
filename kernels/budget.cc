#include "kernels/budget.h"

#include <algorithm>
#include <cmath>

namespace kvtrim {

int64_t RoundHalfUp(double x) { return static_cast<int64_t>(std::floor(x + 0.5)); }

int64_t KeptCount(const Budget& budget, int64_t n) {
  if (n <= 0) return 0;
  if (budget.by_fraction) {
    return std::clamp<int64_t>(RoundHalfUp(budget.keep_fraction * static_cast<double>(n)), 1, n);
  }
  return std::clamp<int64_t>(budget.keep_tokens, 1, n);
}

Protection ClampProtection(Protection requested, int64_t k, int64_t n) {
  k = std::min(k, n);
  Protection p;
  p.sink = std::clamp<int64_t>(requested.sink, 0, k);
  p.recent = std::clamp<int64_t>(requested.recent, 0, k - p.sink);
  return p;
}

}  // namespace kvtrim
