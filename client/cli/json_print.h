// The JSON counterparts of print.h (kvtrim --json): what each command prints, as objects a
// script can read without parsing text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/cli/print.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "nlohmann/json.hpp"

namespace kvtrim::cli {

/// One layer's decision: {"layer_id", "num_tokens", "output_shape", "numerics",
/// "compute_seconds", "round_trip_seconds", "kept": [per KV head], "perturbation": [per KV
/// head] or null, "perturbation_rows"} and, with `show_indices`, "kept_indices": one list
/// per KV head (one list for a shared answer), unpacked from either answer encoding.
nlohmann::json LayerJson(const v1::LayerResult& layer, double round_trip_seconds,
                         bool show_indices);

/// A summary row: {"policy", "budget", "kept", "cached", "kept_ratio", "mean_perturbation"
/// (null when unset), "compute_seconds"}.
nlohmann::json SummaryJson(const CompressSummary& summary);

/// Totals over `layers`: {"layers", "tokens_in", "tokens_kept"} (heads * n in, kept out).
nlohmann::json TotalsJson(const std::vector<v1::LayerResult>& layers);

/// Answered layers and tokens over a whole answer (what TotalsJson and the text report show).
struct LayerTotals {
  int64_t layers = 0;
  int64_t tokens_in = 0;    // sum over layers and KV heads of n
  int64_t tokens_kept = 0;  // sum over layers and KV heads of the kept count
};
/// The totals of `layers`.
LayerTotals SumLayers(const std::vector<v1::LayerResult>& layers);

}  // namespace kvtrim::cli
