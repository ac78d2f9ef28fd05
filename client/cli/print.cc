#include "client/cli/print.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/kept_lists.h"
#include "client/numerics.h"

namespace kvtrim::cli {
namespace {

const char* InputName(int input) {
  switch (input) {
    case v1::POLICY_INPUT_KEYS:
      return "keys";
    case v1::POLICY_INPUT_VALUES:
      return "values";
    case v1::POLICY_INPUT_QUERIES:
      return "queries";
    case v1::POLICY_INPUT_MODEL:
      return "model";
    case v1::POLICY_INPUT_PROFILE:
      return "profile";
    default:
      return "?";
  }
}

const char* ScopeName(v1::DecisionScope scope) {
  switch (scope) {
    case v1::DECISION_SCOPE_HEAD:
      return "head";
    case v1::DECISION_SCOPE_LAYER:
      return "layer";
    case v1::DECISION_SCOPE_MODEL:
      return "model";
    default:
      return "unspecified";
  }
}

const char* KindName(v1::ParamSpec::Kind kind) {
  switch (kind) {
    case v1::ParamSpec::KIND_INT:
      return "int";
    case v1::ParamSpec::KIND_FLOAT:
      return "float";
    case v1::ParamSpec::KIND_BOOL:
      return "bool";
    case v1::ParamSpec::KIND_ENUM:
      return "enum";
    default:
      return "?";
  }
}

std::string Inputs(const google::protobuf::RepeatedField<int>& inputs) {
  if (inputs.empty()) return "-";
  return absl::StrJoin(inputs, ", ", [](std::string* out, int input) {
    out->append(InputName(input));
  });
}

/// "default 8, range [1, 4096]" / "default max, choices {max, avg}" / "default true".
std::string ParamSummary(const v1::ParamSpec& p) {
  switch (p.kind()) {
    case v1::ParamSpec::KIND_ENUM:
      return absl::StrFormat("default %s, choices {%s}", p.default_text(),
                             absl::StrJoin(p.choices(), ", "));
    case v1::ParamSpec::KIND_BOOL:
      return absl::StrFormat("default %s", p.default_number() != 0 ? "true" : "false");
    default:
      return absl::StrFormat("default %g, range [%g, %g]", p.default_number(), p.min(), p.max());
  }
}

/// One line of the summary table: the column widths shared by its header and its rows.
std::string SummaryLine(const std::string& policy, const std::string& keep,
                        const std::string& kept, const std::string& perturbation,
                        const std::string& time) {
  return absl::StrFormat("%-16s %-15s %-19s %12s %19s\n", policy, keep, kept, perturbation, time);
}

}  // namespace

void PrintPolicies(const v1::ListPoliciesResponse& response, std::ostream& out) {
  for (const v1::PolicyInfo& policy : response.policies()) {
    out << policy.name() << " - " << policy.description() << "\n";
    if (!policy.paper().empty()) out << "  paper:     " << policy.paper() << "\n";
    out << absl::StrFormat("  parts:     scorer=%s allocator=%s selector=%s  scope=%s\n",
                           policy.scorer(), policy.allocator(), policy.selector(),
                           ScopeName(policy.scope()));
    out << "  inputs:    " << Inputs(policy.inputs())
        << "  (optional: " << Inputs(policy.optional_inputs()) << ")\n";
    out << absl::StrFormat("  protected: sink=%d recent=%s\n", policy.default_sink_tokens(),
                           policy.default_recent_tokens());
    out << "  shapes:    "
        << absl::StrJoin(policy.output_shapes(), ", ",
                         [](std::string* text, int shape) {
                           text->append(absl::AsciiStrToLower(
                               v1::OutputShape_Name(static_cast<v1::OutputShape>(shape))));
                         })
        << "  numerics: "
        << absl::StrJoin(policy.numerics_modes(), ", ",
                         [](std::string* text, int mode) {
                           text->append(NumericsLabel(static_cast<v1::Numerics>(mode)));
                         })
        << "\n";
    if (policy.params().empty()) {
      out << "  params:    none\n";
      continue;
    }
    out << "  params:\n";
    for (const v1::ParamSpec& p : policy.params()) {
      out << absl::StrFormat("    %-18s %-5s  %s", p.name(), KindName(p.kind()), ParamSummary(p));
      if (!p.description().empty()) out << "  - " << p.description();
      out << "\n";
    }
  }
  out << "scorers:    " << absl::StrJoin(response.scorers(), ", ") << "\n";
  out << "allocators: " << absl::StrJoin(response.allocators(), ", ") << "\n";
}

void PrintLayer(const v1::LayerResult& layer, double round_trip_seconds, bool show_indices,
                std::ostream& out) {
  out << absl::StrFormat("layer %d  n=%d  output=%s  numerics=%s  compute=%.6fs  rtt=%.6fs\n",
                         layer.layer_id(), layer.num_tokens(),
                         v1::OutputShape_Name(layer.output_shape()),
                         NumericsLabel(layer.numerics()), layer.compute_seconds(),
                         round_trip_seconds);
  std::vector<std::string> kept, perturbation;
  for (const v1::HeadStats& head : layer.heads()) {
    kept.push_back(absl::StrCat(head.kept()));
    if (head.has_perturbation()) perturbation.push_back(absl::StrFormat("%.4g", head.perturbation()));
  }
  out << "  kept per head:          " << absl::StrJoin(kept, " ") << "\n";
  if (!perturbation.empty()) {
    out << "  perturbation per head:  " << absl::StrJoin(perturbation, " ") << "\n";
  }
  if (!show_indices) return;
  absl::StatusOr<KeptLists> lists = KeptLists::Of(layer, "layer");
  if (!lists.ok()) {
    out << "  indices: " << lists.status().message() << "\n";
    return;
  }
  for (int64_t list = 0; list < lists->num_lists(); ++list) {
    out << absl::StrFormat("  indices[%s]: %s\n",
                           layer.output_shape() == v1::SHARED ? "shared" : absl::StrCat(list),
                           absl::StrJoin(lists->List(list), " "));
  }
}

void PrintModels(const v1::ListModelsResponse& response, std::ostream& out) {
  if (response.models().empty()) {
    out << "no models registered\n";
    return;
  }
  for (const v1::ModelInfo& model : response.models()) {
    const v1::ModelHeader& h = model.header();
    out << absl::StrFormat(
        "%s  %s\n  layers=%d query_heads=%d kv_heads=%d head_dim=%d hidden_size=%d "
        "rope_theta=%g%s\n  weights (%d): %s\n",
        model.digest(), h.name().empty() ? "(unnamed)" : h.name(), h.num_layers(),
        h.num_query_heads(), h.num_kv_heads(), h.head_dim(), h.hidden_size(), h.rope_theta(),
        h.rope_scaling_json().empty() ? "" : absl::StrCat(" rope_scaling=", h.rope_scaling_json()),
        model.weights_size(), absl::StrJoin(model.weights(), ", "));
  }
}

void PrintRegions(const v1::ListRegionsResponse& response, bool one_lease, std::ostream& out) {
  if (!response.enabled()) {
    out << "regions off (kvtrimd runs without --allow_client_shm)\n";
    return;
  }
  const auto count = [&response](const char* kind) -> int64_t {
    auto it = response.regions_by_kind().find(kind);
    return it == response.regions_by_kind().end() ? 0 : it->second;
  };
  out << absl::StrFormat(
      "regions on: %d leases, host_shm=%d cuda_ipc=%d cuda_ipc_event=%d, %d bytes page-locked, "
      "at most %d per lease\n",
      response.leases(), count("host_shm"), count("cuda_ipc"), count("cuda_ipc_event"),
      response.pinned_shm_bytes(), response.max_regions_per_client());
  if (!one_lease) return;
  out << absl::StrFormat("this lease: %d regions\n", response.regions_size());
  for (const v1::RegionStatus& region : response.regions()) {
    out << absl::StrFormat("  %s  %-14s %12d bytes  readers=%d%s\n", region.region_id(),
                           region.kind(), region.size_bytes(), region.readers(),
                           region.page_locked() ? "  page-locked" : "");
  }
}

std::string BudgetLabel(const v1::Budget& budget) {
  switch (budget.value_case()) {
    case v1::Budget::kKeepFraction:
      return absl::StrFormat("%g", budget.keep_fraction());
    case v1::Budget::kKeepTokens:
      return absl::StrCat(budget.keep_tokens(), " tokens");
    case v1::Budget::kMaxPerturbation: {
      const v1::PerturbationBudget& target = budget.max_perturbation();
      std::string label = absl::StrFormat("eps=%g", target.epsilon());
      if (target.max_keep_fraction() > 0) {
        absl::StrAppend(&label, absl::StrFormat(",max=%g", target.max_keep_fraction()));
      }
      return label;
    }
    default:
      return "-";
  }
}

CompressSummary Summarize(const v1::CompressionSettings& settings,
                          const std::vector<v1::LayerResult>& layers) {
  CompressSummary summary;
  summary.policy = settings.policy().name();
  summary.budget = BudgetLabel(settings.budget());
  double perturbation_sum = 0;
  int64_t perturbation_heads = 0;
  for (const v1::LayerResult& layer : layers) {
    summary.cached += layer.num_tokens() * layer.heads_size();
    summary.compute_seconds += layer.compute_seconds();
    for (const v1::HeadStats& head : layer.heads()) {
      summary.kept += head.kept();
      if (!head.has_perturbation()) continue;
      perturbation_sum += head.perturbation();
      ++perturbation_heads;
    }
  }
  if (perturbation_heads > 0) summary.mean_perturbation = perturbation_sum / perturbation_heads;
  return summary;
}

void PrintSummaryHeader(std::ostream& out) {
  out << SummaryLine("policy", "keep", "kept tokens", "perturbation", "server compute ms");
}

void PrintSummaryRow(const CompressSummary& summary, std::ostream& out) {
  const std::string kept = absl::StrFormat(
      "%d/%d (%.1f%%)", summary.kept, summary.cached,
      summary.cached > 0 ? 100.0 * summary.kept / summary.cached : 0.0);
  const std::string perturbation = summary.mean_perturbation.has_value()
                                       ? absl::StrFormat("%.4f", *summary.mean_perturbation)
                                       : "-";
  out << SummaryLine(summary.policy, summary.budget, kept, perturbation,
                     absl::StrFormat("%.3f", 1e3 * summary.compute_seconds));
}

}  // namespace kvtrim::cli
