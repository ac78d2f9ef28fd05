// Human-readable printing of kvtrim responses for the CLI.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::cli {

/// Prints every policy (description, paper, parts, scope, inputs, protected-token defaults,
/// output shapes, the numerics modes the server computes it in and each parameter with
/// kind, default and range or choices), then the composable part names.
void PrintPolicies(const v1::ListPoliciesResponse& response, std::ostream& out);

/// Prints every registered model: digest, name, L / H_q / H_kv / d / hidden size, RoPE,
/// then its weight names; "no models registered" when there are none.
void PrintModels(const v1::ListModelsResponse& response, std::ostream& out);
/// The zero-copy state of ListRegions, then (when `one_lease`) that lease's regions.
void PrintRegions(const v1::ListRegionsResponse& response, bool one_lease, std::ostream& out);

/// Prints one layer's decision: n, output shape, the numerics mode that computed it, compute
/// seconds and the client round-trip seconds, then kept count per head, perturbation per
/// head (when present) and, with `show_indices`, the kept index lists.
void PrintLayer(const v1::LayerResult& layer, double round_trip_seconds, bool show_indices,
                std::ostream& out);

/// One row of `kvtrim compress --summary`: one compression of a whole input, totalled over
/// every answered layer and KV head.
struct CompressSummary {
  std::string policy;   // settings.policy.name
  std::string budget;   // BudgetLabel of settings.budget
  int64_t kept = 0;     // HeadStats.kept summed over layers and KV heads
  int64_t cached = 0;   // n * H_kv summed over layers: the tokens that were in the cache
  // Mean of HeadStats.perturbation over the heads of every layer that carry one; unset when
  // none does (no values or queries sent, or --noperturbation).
  std::optional<double> mean_perturbation;
  double compute_seconds = 0;  // LayerResult.compute_seconds summed over layers (server side)
};

/// The budget as a table cell: the fraction ("0.2"), "N tokens", or the error target
/// ("eps=0.2", with ",max=F" when it has a cap).
std::string BudgetLabel(const v1::Budget& budget);

/// Totals `layers`, the answer to one compression with `settings`, into a summary row.
CompressSummary Summarize(const v1::CompressionSettings& settings,
                          const std::vector<v1::LayerResult>& layers);

/// Prints the column header of the summary table, aligned with PrintSummaryRow.
void PrintSummaryHeader(std::ostream& out);

/// Prints one summary row: policy, keep, kept / cached tokens with their percentage, mean
/// perturbation ("-" when unset) and the server's compute milliseconds.
void PrintSummaryRow(const CompressSummary& summary, std::ostream& out);

}  // namespace kvtrim::cli
