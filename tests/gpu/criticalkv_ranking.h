// Shared by the fast-numerics GPU tests (fast_model_test.cc, fast_tolerance_test.cc): the
// ranking a CriticalKV decision selects by, on which the tolerance rule's band lies.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/budget.h"
#include "kernels/decide/select.h"
#include "kernels/decide/decide.h"
#include "kernels/policy_spec.h"

namespace kvtrim::gpu::testing {

/// The final ranking [H_kv, n] of a CriticalKV layer, built from its raw scores as
/// DecideLayer (kernels/decide/decide.cc) builds it: the stage-2 scores (layer.critical) with every
/// protected token and every stage-1 token (the top protected + round_half_up(alpha * b) by
/// protected attention, b = the head's count minus its protected tokens) set to +inf. Every
/// output shape selects its lists by this ranking, so a fast list may differ from the exact
/// one only near its boundary on it: a stage-2 swap is a swap on it, and a change of the
/// stage-1 set only reorders tokens that the +inf and the high critical scores keep anyway.
/// `layer` needs scores, critical and budget (with budget.requested for lukv).
inline absl::StatusOr<std::vector<float>> CriticalKVRanking(const ResolvedPolicy& policy,
                                                            const LayerScores& layer) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  auto protect = [n](const Protection& p, float* row) {
    for (int64_t j = 0; j < p.sink && j < n; ++j) row[j] = kInf;
    for (int64_t j = std::max<int64_t>(0, n - p.recent); j < n; ++j) row[j] = kInf;
  };
  const bool lukv = policy.allocator->kind == AllocatorKind::kLukv &&
                    policy.settings.output_shape != OutputShape::kEqualCount;
  std::vector<float> ranked = layer.scores;
  if (!lukv) {
    for (int64_t h = 0; h < heads; ++h) protect(layer.budget.protection, ranked.data() + h * n);
  }
  auto counts = AllocateCounts(policy, layer, ranked);
  if (!counts.ok()) return counts.status();
  std::vector<Protection> protection(static_cast<size_t>(heads), layer.budget.protection);
  if (lukv) {
    for (int64_t h = 0; h < heads; ++h) {
      protection[h] = ClampProtection(layer.budget.requested, (*counts)[h], n);
      protect(protection[h], ranked.data() + h * n);
    }
  }
  const double alpha = policy.params.Number("alpha");
  std::vector<float> stage2 = layer.critical;
  std::vector<int32_t> stage1;
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t guarded = protection[h].sink + protection[h].recent;
    const int64_t b = std::max<int64_t>(0, (*counts)[h] - guarded);
    const int64_t b1 = std::min(b, RoundHalfUp(alpha * static_cast<double>(b)));
    stage1.clear();
    SelectTopK(ranked.data() + h * n, n, std::min(n, guarded + b1), &stage1);
    float* row = stage2.data() + h * n;
    protect(protection[h], row);
    for (int32_t j : stage1) row[j] = kInf;
  }
  return stage2;
}

/// Whether token j of head h lies within tau * (|a1| + s) of head h's stage-1 boundary a1 on
/// the protected attention scores (a1 = the attention of the last stage-1 token, s = the
/// head's largest finite |attention|): a fast and an exact decision may disagree on such a
/// token's stage (CriticalKVRanking's +inf), then on one more token at the stage-2 boundary.
/// Built as CriticalKVRanking builds the stages (uniform protection; lukv per head).
inline absl::StatusOr<std::function<bool(int64_t, int32_t)>> CriticalKVStage1Band(
    const ResolvedPolicy& policy, const LayerScores& layer, double tau) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  std::vector<float> attention = layer.scores;  // [H, n] protected below
  const bool lukv = policy.allocator->kind == AllocatorKind::kLukv &&
                    policy.settings.output_shape != OutputShape::kEqualCount;
  auto protect = [n](const Protection& p, float* row) {
    for (int64_t j = 0; j < p.sink && j < n; ++j) row[j] = kInf;
    for (int64_t j = std::max<int64_t>(0, n - p.recent); j < n; ++j) row[j] = kInf;
  };
  if (!lukv) {
    for (int64_t h = 0; h < heads; ++h) protect(layer.budget.protection, attention.data() + h * n);
  }
  auto counts = AllocateCounts(policy, layer, attention);
  if (!counts.ok()) return counts.status();
  std::vector<double> boundary(static_cast<size_t>(heads), kInf), scale(static_cast<size_t>(heads), 0);
  std::vector<int32_t> ranking;
  for (int64_t h = 0; h < heads; ++h) {
    Protection p = layer.budget.protection;
    if (lukv) {
      p = ClampProtection(layer.budget.requested, (*counts)[h], n);
      protect(p, attention.data() + h * n);
    }
    const int64_t guarded = p.sink + p.recent;
    const int64_t b = std::max<int64_t>(0, (*counts)[h] - guarded);
    const int64_t b1 = std::min(b, RoundHalfUp(policy.params.Number("alpha") * static_cast<double>(b)));
    const float* row = attention.data() + h * n;
    RankTokens(row, n, &ranking);
    const int64_t last = std::min(n, guarded + b1) - 1;
    if (last >= 0) boundary[h] = row[ranking[last]];
    for (int64_t j = 0; j < n; ++j) {
      if (std::isfinite(row[j])) scale[h] = std::max(scale[h], std::fabs(static_cast<double>(row[j])));
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

}  // namespace kvtrim::gpu::testing
