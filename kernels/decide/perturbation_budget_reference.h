// Tests only: the max_perturbation rule of the proto comment for one head, written out on its
// own (no shared code with kernels/decide/perturbation_budget.cc), as the reference the bisection
// and the backends are checked against.
#pragma once

#include <cstdint>
#include <functional>

namespace kvtrim {

/// The statistic of one head as a function of its kept count k.
using HeadE = std::function<double(int64_t k)>;

/// The count the rule chooses for a head with statistic `e`, floor `k_min` and cap `k_cap`.
inline int64_t ReferenceK(const HeadE& e, int64_t k_min, int64_t k_cap, double epsilon) {
  if (!(e(k_cap) <= epsilon)) return k_cap;
  int64_t lo = k_min, hi = k_cap;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (e(mid) <= epsilon) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace kvtrim
