#include "kernels/lukv/dp_oracle.h"

#include <algorithm>
#include <limits>

namespace kvtrim::lukv {

DpSolution SolveMckpExact(const std::vector<std::vector<double>>& curves, int64_t total,
                          int64_t min_per_head) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const size_t heads = curves.size();
  DpSolution solution;
  if (total < 0) return solution;
  const size_t width = static_cast<size_t>(total) + 1;
  // best[s]: minimum loss of the heads seen so far holding s tokens; choice[h][s]: b_h there.
  std::vector<double> best(width, kInf), next(width);
  std::vector<std::vector<int64_t>> choice(heads, std::vector<int64_t>(width, -1));
  best[0] = 0;
  for (size_t h = 0; h < heads; ++h) {
    const int64_t t = static_cast<int64_t>(curves[h].size()) - 1;
    std::fill(next.begin(), next.end(), kInf);
    for (int64_t s = 0; s <= total; ++s) {
      for (int64_t b = min_per_head; b <= std::min(t, s); ++b) {
        const double prev = best[static_cast<size_t>(s - b)];
        if (prev == kInf) continue;
        const double cand = prev + curves[h][static_cast<size_t>(b)];
        if (cand < next[static_cast<size_t>(s)]) {
          next[static_cast<size_t>(s)] = cand;
          choice[h][static_cast<size_t>(s)] = b;
        }
      }
    }
    best.swap(next);
  }
  if (best[static_cast<size_t>(total)] == kInf) return solution;
  solution.feasible = true;
  solution.value = best[static_cast<size_t>(total)];
  solution.alloc.assign(heads, 0);
  int64_t s = total;
  for (size_t h = heads; h-- > 0;) {
    solution.alloc[h] = choice[h][static_cast<size_t>(s)];
    s -= solution.alloc[h];
  }
  return solution;
}

double CurvesValue(const std::vector<std::vector<double>>& curves,
                   const std::vector<int64_t>& alloc) {
  double value = 0;
  for (size_t h = 0; h < curves.size(); ++h) value += curves[h][static_cast<size_t>(alloc[h])];
  return value;
}

}  // namespace kvtrim::lukv
