// Human-readable printing of kvtrim responses for the CLI.
#pragma once

#include <ostream>

#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::cli {

/// Prints every policy (description, paper, parts, scope, inputs, protected-token defaults,
/// output shapes, the numerics modes the server computes it in and each parameter with
/// kind, default and range or choices), then the composable part names.
void PrintPolicies(const v1::ListPoliciesResponse& response, std::ostream& out);

/// Prints every registered model: digest, name, L / H_q / H_kv / d / hidden size, RoPE,
/// then its weight names; "no models registered" when there are none.
void PrintModels(const v1::ListModelsResponse& response, std::ostream& out);

/// Prints one layer's decision: n, output shape, the numerics mode that computed it, compute
/// seconds and the client round-trip seconds, then kept count per head, perturbation per
/// head (when present) and, with `show_indices`, the kept index lists.
void PrintLayer(const v1::LayerResult& layer, double round_trip_seconds, bool show_indices,
                std::ostream& out);

}  // namespace kvtrim::cli
