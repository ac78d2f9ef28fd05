#include "kernels/lukv/greedy_solver.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/budget.h"
#include "kernels/lukv/pava.h"

namespace kvtrim::lukv {

double GridRatio(int row) { return static_cast<double>(row + 1) / 100.0; }

int64_t GridBudget(int row, int64_t heads, int64_t T) {
  return RoundHalfUp((1.0 - GridRatio(row)) * static_cast<double>(heads) *
                     static_cast<double>(T));
}

int64_t RetentionFloor(int64_t T) {
  // ceil(0.01 * T) in exact integer arithmetic.
  return std::clamp<int64_t>((T + 99) / 100, 0, std::max<int64_t>(T, 0));
}

std::vector<std::vector<int64_t>> GreedyAllocate(const std::vector<std::vector<double>>& gains,
                                                 int64_t b_min,
                                                 const std::vector<int64_t>& budgets) {
  struct Item {
    double gain;
    int32_t head;
    int32_t index;  // 0-based position in the head's order (i - 1)
  };
  const int64_t heads = static_cast<int64_t>(gains.size());
  std::vector<int64_t> alloc(static_cast<size_t>(heads));
  std::vector<Item> pool;
  int64_t floor_total = 0;
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t t = static_cast<int64_t>(gains[h].size());
    alloc[h] = std::min(b_min, t);
    floor_total += alloc[h];
    for (int64_t i = alloc[h]; i < t; ++i) {
      pool.push_back({gains[h][i], static_cast<int32_t>(h), static_cast<int32_t>(i)});
    }
  }
  std::sort(pool.begin(), pool.end(), [](const Item& a, const Item& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.head != b.head) return a.head < b.head;
    return a.index < b.index;
  });
  std::vector<std::vector<int64_t>> out;
  out.reserve(budgets.size());
  size_t taken = 0;
  int64_t previous = budgets.empty() ? 0 : budgets.front();
  for (int64_t budget : budgets) {
    if (budget < previous) std::abort();  // programming error: budgets must be non-decreasing
    previous = budget;
    const int64_t want =
        std::clamp<int64_t>(budget - floor_total, 0, static_cast<int64_t>(pool.size()));
    for (; taken < static_cast<size_t>(want); ++taken) ++alloc[pool[taken].head];
    out.push_back(alloc);
  }
  return out;
}

std::vector<double> SolveLocalRatios(const std::vector<std::vector<double>>& d, int64_t num_layers,
                                     int64_t num_heads) {
  const int64_t heads = num_layers * num_heads;
  const int64_t T = heads > 0 ? static_cast<int64_t>(d[0].size()) : 0;
  std::vector<std::vector<double>> gains(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) gains[h] = AntitonicPava(d[h]);
  // Descending ρ is ascending budget: one sweep serves every row (allocations are nested).
  std::vector<int64_t> budgets;
  for (int row = kGridRows - 1; row >= 0; --row) budgets.push_back(GridBudget(row, heads, T));
  const std::vector<std::vector<int64_t>> alloc = GreedyAllocate(gains, RetentionFloor(T), budgets);
  std::vector<double> ratios(static_cast<size_t>(kGridRows * heads));
  for (int row = 0; row < kGridRows; ++row) {
    const std::vector<int64_t>& a = alloc[static_cast<size_t>(kGridRows - 1 - row)];
    for (int64_t h = 0; h < heads; ++h) {
      ratios[row * heads + h] = 1.0 - static_cast<double>(a[h]) / static_cast<double>(T);
    }
  }
  return ratios;
}

}  // namespace kvtrim::lukv
