// Shared by the fast-numerics tolerance tests (CPU and GPU fast_tolerance_test.cc): the
// ranking a CriticalKV decision selects by, on which the tolerance rule's band lies.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/budget.h"
#include "kernels/decide/decide.h"
#include "kernels/decide/protection.h"
#include "kernels/decide/select.h"
#include "kernels/policy_spec.h"

namespace kvtrim::testing {

/// The final ranking [H_kv, n] of a CriticalKV layer, the one DecideLayer selects by
/// (RankLayer, kernels/decide/decide.h): the stage-2 scores (layer.critical) with every
/// protected token and every stage-1 token (the top protected + round_half_up(alpha * b) by
/// protected attention, b = the head's count minus its protected tokens) set to +inf. Every
/// output shape selects its lists by this ranking, so a fast list may differ from the exact
/// one only near its boundary on it: a stage-2 swap is a swap on it, and a change of the
/// stage-1 set only reorders tokens that the +inf and the high critical scores keep anyway.
/// `layer` needs scores, critical and budget (with budget.requested for lukv).
inline absl::StatusOr<std::vector<float>> CriticalKVRanking(const ResolvedPolicy& policy,
                                                            const LayerScores& layer) {
  absl::StatusOr<LayerRanking> ranking = RankLayer(policy, layer);
  if (!ranking.ok()) return ranking.status();
  return std::move(ranking->ranked);
}

/// Whether token j of head h lies within tau * (|a1| + s) of head h's stage-1 boundary a1 on
/// the protected attention scores (a1 = the attention of the last stage-1 token, s = the
/// head's largest finite |attention|): a fast and an exact decision may disagree on such a
/// token's stage (CriticalKVRanking's +inf), then on one more token at the stage-2 boundary.
/// The stages are RankLayer's (its counts and per-head protection).
inline absl::StatusOr<std::function<bool(int64_t, int32_t)>> CriticalKVStage1Band(
    const ResolvedPolicy& policy, const LayerScores& layer, double tau) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  absl::StatusOr<LayerRanking> stages = RankLayer(policy, layer);
  if (!stages.ok()) return stages.status();
  const double alpha = policy.params.Number("alpha");
  std::vector<float> attention = layer.scores;  // [H, n], protected per head below
  std::vector<double> boundary(static_cast<size_t>(heads), kInf);
  std::vector<double> scale(static_cast<size_t>(heads), 0);
  std::vector<int32_t> ranking;
  for (int64_t h = 0; h < heads; ++h) {
    float* row = attention.data() + h * n;
    ApplyProtection(stages->protection[h], 1, n, row);
    RankTokens(row, n, &ranking);
    const int64_t last =
        CriticalKVStage1Tokens(alpha, stages->counts[h], stages->protection[h], n) - 1;
    if (last >= 0) boundary[h] = row[ranking[last]];
    for (int64_t j = 0; j < n; ++j) {
      if (std::isfinite(row[j])) {
        scale[h] = std::max(scale[h], std::fabs(static_cast<double>(row[j])));
      }
    }
  }
  return std::function<bool(int64_t, int32_t)>(
      [attention, boundary, scale, n, tau](int64_t h, int32_t j) {
        const double a = attention[static_cast<size_t>(h * n + j)];
        const double b = boundary[static_cast<size_t>(h)];
        return std::isfinite(a) && std::isfinite(b) &&
               std::fabs(a - b) <= tau * (std::fabs(b) + scale[static_cast<size_t>(h)]);
      });
}

}  // namespace kvtrim::testing
