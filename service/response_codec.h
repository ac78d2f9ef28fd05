// Encoding of kernel results (layer decisions, the policy registry) into proto messages.
#pragma once

#include "kernels/layer.h"
#include "kernels/registry.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::service {

/// Copies one layer decision into a LayerResult: layer_id, n, output shape, CSR offsets
/// ([H_kv + 1] per head or [2] shared) and indices, per-head kept counts and (when the
/// backend computed it) perturbation, and compute_seconds.
void EncodeLayerResult(const LayerDecision& decision, v1::LayerResult* out);

/// Describes every policy of `registry` for ListPolicies: the presets first, then every
/// scorer combined with every allocator ("SCORER+ALLOCATOR"), plus the part names.
void EncodePolicies(const PolicyRegistry& registry, v1::ListPoliciesResponse* out);

}  // namespace kvtrim::service
