#include "kernels/decide/protection.h"

#include <algorithm>
#include <limits>

namespace kvtrim {

void ApplyProtection(const Protection& p, int64_t num_heads, int64_t n, float* scores) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < num_heads; ++h) {
    float* s = scores + h * n;
    for (int64_t j = 0; j < p.sink && j < n; ++j) s[j] = inf;
    for (int64_t j = std::max<int64_t>(0, n - p.recent); j < n; ++j) s[j] = inf;
  }
}

}  // namespace kvtrim
