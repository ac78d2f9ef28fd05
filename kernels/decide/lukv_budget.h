// LU-KV online allocation (lukv.md §5.3): per-head budgets of one layer from a profile.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/budget.h"
#include "kernels/model.h"

namespace kvtrim {

/// The global evicted ratio sigma of a request: 1 - keep_fraction, or 1 - keep_tokens / n.
double LukvEvictedRatio(const Budget& budget, int64_t n);

/// Per-head kept counts [H_kv] of layer `layer` with n tokens: local prune ratio r_h from the
/// nearest profile row k = clamp(round_half_up(100 sigma) - 1, 0, 98) (or linear
/// interpolation between the two rows around 100 sigma - 1), ideal_h = (1 - r_h) n,
/// b_h = floor(ideal_h), the remainder round_half_up(sum ideal) - sum b_h going to the
/// largest fractional parts (ties: lower head), then clamped to [1, n].
std::vector<int64_t> LukvHeadBudgets(const LukvProfile& profile, int64_t num_layers,
                                     int64_t num_kv_heads, int64_t layer, int64_t n,
                                     double sigma, bool interpolate);

}  // namespace kvtrim
