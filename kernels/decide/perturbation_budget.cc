#include "kernels/decide/perturbation_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "kernels/decide/protection.h"
#include "kernels/decide/select.h"

namespace kvtrim {

absl::StatusOr<BisectionResult> BisectKeptCounts(const std::vector<int64_t>& k_min,
                                                 const std::vector<int64_t>& k_cap,
                                                 double epsilon, const CountEvaluator& evaluate) {
  const size_t heads = k_min.size();
  if (k_cap.size() != heads) {
    return absl::InvalidArgumentError(absl::StrCat("max_perturbation: ", heads,
                                                   " lower bounds for ", k_cap.size(), " caps"));
  }
  for (size_t h = 0; h < heads; ++h) {
    if (k_min[h] < 1 || k_min[h] > k_cap[h]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_perturbation: head ", h, " has k_min=", k_min[h], ", k_cap=", k_cap[h],
          " (needs 1 <= k_min <= k_cap)"));
    }
  }
  BisectionResult result;
  std::vector<double> values;
  auto run = [&](const std::vector<int64_t>& counts) -> absl::Status {
    values.assign(heads, 0.0);
    ++result.evaluations;
    KVTRIM_RETURN_IF_ERROR(evaluate(counts, &values));
    if (values.size() != heads) {
      return absl::InternalError(absl::StrCat("max_perturbation: the evaluator returned ",
                                              values.size(), " values for ", heads, " heads"));
    }
    return absl::OkStatus();
  };
  // E(k_cap) first: a head above epsilon there keeps the cap.
  KVTRIM_RETURN_IF_ERROR(run(k_cap));
  std::vector<int64_t> lo(heads), hi(k_cap);
  result.perturbation = values;  // E(hi) of every head, kept as hi moves
  for (size_t h = 0; h < heads; ++h) {
    lo[h] = values[h] <= epsilon ? k_min[h] : k_cap[h];  // NaN is not <= epsilon
  }
  std::vector<int64_t> mid(heads);
  for (;;) {
    bool searching = false;
    for (size_t h = 0; h < heads; ++h) {
      mid[h] = lo[h] < hi[h] ? lo[h] + (hi[h] - lo[h]) / 2 : lo[h];
      searching = searching || lo[h] < hi[h];
    }
    if (!searching) break;
    KVTRIM_RETURN_IF_ERROR(run(mid));
    for (size_t h = 0; h < heads; ++h) {
      if (lo[h] >= hi[h]) continue;  // converged: its list only filled the layer's evaluation
      if (values[h] <= epsilon) {
        hi[h] = mid[h];
        result.perturbation[h] = values[h];
      } else {
        lo[h] = mid[h] + 1;
      }
    }
  }
  result.kept = std::move(lo);
  return result;
}

std::vector<int32_t> RankHeads(const LayerScores& layer, int64_t depth) {
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  const Protection& p = layer.budget.protection;
  std::vector<int32_t> ranking(static_cast<size_t>(heads * depth));
  std::vector<float> row(static_cast<size_t>(n));
  std::vector<int32_t> order;
  for (int64_t h = 0; h < heads; ++h) {
    std::copy_n(layer.scores.begin() + h * n, n, row.begin());
    ApplyProtection(p, 1, n, row.data());
    RankTokens(row.data(), n, &order);  // top-k's order: score descending, lower index first
    std::copy_n(order.begin(), depth, ranking.begin() + h * depth);
  }
  return ranking;
}

void PrefixLists(const std::vector<int32_t>& ranking, int64_t depth,
                 const std::vector<int64_t>& counts, std::vector<int64_t>* offsets,
                 std::vector<int32_t>* indices) {
  offsets->assign(1, 0);
  indices->clear();
  for (size_t h = 0; h < counts.size(); ++h) {
    const auto first = ranking.begin() + static_cast<int64_t>(h) * depth;
    const size_t begin = indices->size();
    indices->insert(indices->end(), first, first + counts[h]);
    std::sort(indices->begin() + static_cast<int64_t>(begin), indices->end());
    offsets->push_back(static_cast<int64_t>(indices->size()));
  }
}

absl::Status DecidePerturbationBudget(const ResolvedPolicy& policy, const LayerScores& layer,
                                      PerturbationProbe& probe, LayerDecision* out) {
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  const int64_t cap = std::clamp<int64_t>(layer.budget.kept_per_head, 1, n);
  const Protection& p = layer.budget.protection;
  const int64_t floor = std::clamp<int64_t>(p.sink + p.recent, 1, cap);
  const std::vector<int32_t> ranking = RankHeads(layer, cap);
  std::vector<int64_t> offsets;
  std::vector<int32_t> indices;
  const CountEvaluator evaluate = [&](const std::vector<int64_t>& counts,
                                      std::vector<double>* values) {
    PrefixLists(ranking, cap, counts, &offsets, &indices);
    return probe.Evaluate(offsets, indices, values);
  };
  const std::vector<int64_t> k_min(static_cast<size_t>(heads), floor);
  const std::vector<int64_t> k_cap(static_cast<size_t>(heads), cap);
  absl::StatusOr<BisectionResult> found =
      BisectKeptCounts(k_min, k_cap, policy.settings.budget.epsilon, evaluate);
  if (!found.ok()) return found.status();
  out->layer_id = layer.layer_id;
  out->num_tokens = n;
  out->output_shape = OutputShape::kPerHead;
  PrefixLists(ranking, cap, found->kept, &out->offsets, &out->indices);
  out->kept_per_head.assign(found->kept.begin(), found->kept.end());
  out->perturbation = std::move(found->perturbation);
  out->numerics = layer.numerics;
  return absl::OkStatus();
}

absl::Status CheckPerturbationBudgetNumbers(const Budget& budget, const std::string& field) {
  if (!budget.by_perturbation) return absl::OkStatus();
  if (!std::isfinite(budget.epsilon) || budget.epsilon < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".budget.max_perturbation.epsilon: must be finite and >= 0, got ",
                     ExactNumber(budget.epsilon)));
  }
  if (!(budget.keep_fraction > 0.0 && budget.keep_fraction <= 1.0) || !budget.by_fraction) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".budget.max_perturbation.max_keep_fraction: must be in (0, 1] (0 = 1), got ",
        ExactNumber(budget.keep_fraction)));
  }
  return absl::OkStatus();
}

absl::Status CheckPerturbationBudget(const ResolvedPolicy& policy, const std::string& field) {
  const CompressionSettings& s = policy.settings;
  if (!s.budget.by_perturbation) return absl::OkStatus();
  if (!s.perturbation) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".perturbation: a max_perturbation budget is decided by the perturbation "
               "statistic; PERTURBATION_OFF is not allowed with it (use FULL or SAMPLED)"));
  }
  if (s.output_shape != OutputShape::kPerHead) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".output_shape: a max_perturbation budget answers PER_HEAD lists (a count per "
               "head); SHARED, BLOCK_ALIGNED and EQUAL_COUNT are not defined for it"));
  }
  if (policy.scorer->kind == ScorerKind::kCriticalKV) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".policy.name: criticalkv's two-stage selection depends on the kept count, so "
               "its kept sets are not nested in k; a max_perturbation budget needs a per-head "
               "ranking (use keep_fraction or keep_tokens with criticalkv)"));
  }
  return absl::OkStatus();
}

}  // namespace kvtrim
