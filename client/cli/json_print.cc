#include "client/cli/json_print.h"

#include "absl/status/statusor.h"
#include "client/kept_lists.h"
#include "client/numerics.h"

namespace kvtrim::cli {

nlohmann::json LayerJson(const v1::LayerResult& layer, double round_trip_seconds,
                         bool show_indices) {
  nlohmann::json kept = nlohmann::json::array();
  nlohmann::json perturbation = nlohmann::json::array();
  bool has_perturbation = false;
  for (const v1::HeadStats& head : layer.heads()) {
    kept.push_back(head.kept());
    if (head.has_perturbation()) {
      perturbation.push_back(head.perturbation());
      has_perturbation = true;
    } else {
      perturbation.push_back(nullptr);
    }
  }
  nlohmann::json answer = {
      {"layer_id", layer.layer_id()},
      {"num_tokens", layer.num_tokens()},
      {"output_shape", v1::OutputShape_Name(layer.output_shape())},
      {"numerics", NumericsLabel(layer.numerics())},
      {"compute_seconds", layer.compute_seconds()},
      {"round_trip_seconds", round_trip_seconds},
      {"kept", std::move(kept)},
      {"perturbation", has_perturbation ? std::move(perturbation) : nlohmann::json()},
      {"perturbation_rows", layer.perturbation_rows()},
  };
  if (!show_indices) return answer;
  absl::StatusOr<KeptLists> lists = KeptLists::Of(layer, "layer");
  if (!lists.ok()) {
    answer["kept_indices_error"] = std::string(lists.status().message());
    return answer;
  }
  nlohmann::json indices = nlohmann::json::array();
  for (int64_t list = 0; list < lists->num_lists(); ++list) {
    nlohmann::json one = nlohmann::json::array();
    for (const auto index : lists->List(list)) one.push_back(index);
    indices.push_back(std::move(one));
  }
  answer["kept_indices"] = std::move(indices);
  return answer;
}

nlohmann::json SummaryJson(const CompressSummary& summary) {
  return {
      {"policy", summary.policy},
      {"budget", summary.budget},
      {"kept", summary.kept},
      {"cached", summary.cached},
      {"kept_ratio",
       summary.cached > 0 ? static_cast<double>(summary.kept) / summary.cached : 0.0},
      {"mean_perturbation", summary.mean_perturbation.has_value()
                                ? nlohmann::json(*summary.mean_perturbation)
                                : nlohmann::json()},
      {"compute_seconds", summary.compute_seconds},
  };
}

LayerTotals SumLayers(const std::vector<v1::LayerResult>& layers) {
  LayerTotals totals;
  totals.layers = static_cast<int64_t>(layers.size());
  for (const v1::LayerResult& layer : layers) {
    totals.tokens_in += layer.num_tokens() * layer.heads_size();
    for (const v1::HeadStats& head : layer.heads()) totals.tokens_kept += head.kept();
  }
  return totals;
}

nlohmann::json TotalsJson(const std::vector<v1::LayerResult>& layers) {
  const LayerTotals totals = SumLayers(layers);
  return {{"layers", totals.layers},
          {"tokens_in", totals.tokens_in},
          {"tokens_kept", totals.tokens_kept}};
}

}  // namespace kvtrim::cli
