// Error-targeted budgets (proto Budget.max_perturbation), shared by every backend: per KV
// head, the fewest tokens of the head's top-k ranking whose output perturbation statistic is
// at most epsilon, found by a bisection over k that advances every head of the layer at once
// (one evaluation of the statistic over the whole layer per step, per-head kept lists).
//
// Per head h: R_h = the order in which per-head top-k takes tokens (protected sink / recent
// tokens first, then score descending, ties to the lower index), so the first k of R_h is
// what a uniform per-head budget of k keeps. k_cap = the cap's kept count (rule 2 on
// max_keep_fraction), k_min = the head's protected count (at least 1, at most k_cap).
// E_h(k) = the statistic of the first k of R_h.
//   if E_h(k_cap) > epsilon: k = k_cap (capped);
//   else lo = k_min, hi = k_cap; while lo < hi { mid = lo + (hi - lo) / 2;
//        if E_h(mid) <= epsilon then hi = mid else lo = mid + 1 }; k = lo.
// A statistic that is not a number (fast numerics overflowing fp32) is not <= epsilon.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/decide/decide.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim {

/// Evaluates E for per-head kept counts: values [H] of counts [H] (counts[h] in
/// [k_min[h], k_cap[h]]).
using CountEvaluator =
    std::function<absl::Status(const std::vector<int64_t>& counts, std::vector<double>* values)>;

/// What BisectKeptCounts found: per head the kept count k and E(k) of that count.
struct BisectionResult {
  std::vector<int64_t> kept;          // [H]
  std::vector<double> perturbation;   // [H] E_h(kept[h]) as evaluated
  int32_t evaluations = 0;            // calls of the evaluator (1 + the bisection's steps)
};

/// The bisection above for every head at once (k_min [H], k_cap [H], 1 <= k_min <= k_cap):
/// first E(k_cap), then one evaluation per step with mid for the heads still searching and
/// their final k for the others, until every head has converged (about log2(k_cap - k_min)
/// steps). INVALID_ARGUMENT for mismatched or out-of-order bounds; the evaluator's errors.
absl::StatusOr<BisectionResult> BisectKeptCounts(const std::vector<int64_t>& k_min,
                                                 const std::vector<int64_t>& k_cap,
                                                 double epsilon, const CountEvaluator& evaluate);

/// The first `depth` tokens of every head's ranking R_h over `layer.scores` [H_kv, n] with
/// layer.budget.protection applied: ranking [H_kv, depth], row-major (depth <= n).
std::vector<int32_t> RankHeads(const LayerScores& layer, int64_t depth);

/// Per-head CSR of the first counts[h] tokens of each ranking row ([H, depth], as RankHeads
/// writes it), each list ascending: offsets [H + 1], indices.
void PrefixLists(const std::vector<int32_t>& ranking, int64_t depth,
                 const std::vector<int64_t>& counts, std::vector<int64_t>* offsets,
                 std::vector<int32_t>* indices);

/// Decides one layer of a max_perturbation budget from its raw scores (layer.budget holds the
/// cap k_cap and its protection) and a probe of the same layer: PER_HEAD lists, kept_per_head
/// = k, perturbation = E_h(k) of the final lists. Every other field but numerics,
/// perturbation_rows / _sampled and the times is filled. Errors: the probe's.
absl::Status DecidePerturbationBudget(const ResolvedPolicy& policy, const LayerScores& layer,
                                      PerturbationProbe& probe, LayerDecision* out);

/// The settings a max_perturbation budget needs, checked once a policy is resolved: the
/// statistic on (INVALID_ARGUMENT "<field>.perturbation"), PER_HEAD lists ("<field>
/// .output_shape"), and a scorer whose kept sets are nested in k ("<field>.policy.name":
/// criticalkv's two-stage selection is not). OK when the budget is not max_perturbation.
absl::Status CheckPerturbationBudget(const ResolvedPolicy& policy, const std::string& field);

/// The budget's own numbers: epsilon finite and >= 0 ("<field>.budget.max_perturbation
/// .epsilon"), the cap keep_fraction in (0, 1] ("<field>.budget.max_perturbation
/// .max_keep_fraction"), numbers printed exactly. OK when the budget is not max_perturbation.
absl::Status CheckPerturbationBudgetNumbers(const Budget& budget, const std::string& field);

}  // namespace kvtrim
