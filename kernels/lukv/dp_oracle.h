// Exact reference for the LU-KV allocation problem (lukv.md §4, §9 items 5-7): the
// multiple-choice knapsack with unit weights, solved by dynamic programming in
// O(heads · B · T). Too slow at full scale; used as a test oracle.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::lukv {

/// An optimal allocation: the minimum of Σ_h curve_h(alloc_h) and one argmin.
struct DpSolution {
  bool feasible = false;       // false when no allocation meets the constraints
  double value = 0;            // Σ_h curves[h][alloc[h]]
  std::vector<int64_t> alloc;  // [heads]
};

/// Minimises Σ_h curves[h][b_h] subject to Σ_h b_h = total and min_per_head <= b_h <= T_h,
/// where curves [heads][T_h + 1] hold each head's loss for b = 0..T_h kept tokens.
DpSolution SolveMckpExact(const std::vector<std::vector<double>>& curves, int64_t total,
                          int64_t min_per_head = 0);

/// Σ_h curves[h][alloc[h]].
double CurvesValue(const std::vector<std::vector<double>>& curves,
                   const std::vector<int64_t>& alloc);

}  // namespace kvtrim::lukv
