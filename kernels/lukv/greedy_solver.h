// The greedy solver of LU-KV (lukv.md §5.1): per-head budgets maximising the relaxed
// (convex-hull) gains under a global budget, swept over the 99-row grid of global ratios.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::lukv {

/// Rows of the grid: global evicted ratios ρ = 0.01, 0.02, ..., 0.99.
constexpr int kGridRows = 99;

/// ρ of grid row k: (k + 1) / 100.
double GridRatio(int row);

/// Global kept budget of row k: B(ρ) = round-half-up((1 - ρ) · heads · T) in double.
int64_t GridBudget(int row, int64_t heads, int64_t T);

/// Retention floor b_min = ceil(0.01 · T) (at most 99% evicted per head), clamped to [0, T].
int64_t RetentionFloor(int64_t T);

/// The greedy of §5.1 for arbitrary budgets. `gains` [heads][T_h] are non-increasing per head
/// (ĝ). Every head first gets min(b_min, T_h); the pool of the remaining items
/// (ĝ_h(i), h, i) is sorted by (-ĝ, h, i) and consumed as one prefix that grows with the
/// budget. `budgets` [B] must be non-decreasing; returns alloc [B][heads] with
/// Σ_h alloc = clamp(budget, Σ floor, Σ T_h). Allocations are nested in the budget.
std::vector<std::vector<int64_t>> GreedyAllocate(const std::vector<std::vector<double>>& gains,
                                                 int64_t b_min,
                                                 const std::vector<int64_t>& budgets);

/// §5.1 for one calibration query: raw gains d [L*H][T] (head (ℓ,h) at ℓ*H + h, ordered by
/// π with protected tokens first) -> ĝ by antitonic PAVA, floor b_min = RetentionFloor(T),
/// one sweep over the grid -> r* [99, L, H] with r*[k, ℓ, h] = 1 - alloc/T (double).
std::vector<double> SolveLocalRatios(const std::vector<std::vector<double>>& d, int64_t num_layers,
                                     int64_t num_heads);

}  // namespace kvtrim::lukv
