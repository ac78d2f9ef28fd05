// Encoding of kernel results (layer decisions, the policy registry) into proto messages.
#pragma once

#include "kernels/backend.h"
#include "kernels/layer.h"
#include "kernels/registry.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::service {

/// The proto value of a numerics mode (NUMERICS_FAST / NUMERICS_EXACT).
v1::Numerics EncodeNumerics(Numerics mode);

/// Copies one layer decision into a LayerResult: layer_id, n, output shape, CSR offsets
/// ([H_kv + 1] per head or [2] shared) and indices (repeated fields, or with `packed` the
/// little-endian bytes of LayerResult.packed: kvtrim/v1/packed_lists.h), per-head kept counts
/// and (when the backend computed it) perturbation, compute_seconds and the numerics mode
/// that computed it.
void EncodeLayerResult(const LayerDecision& decision, v1::LayerResult* out, bool packed = false);

/// Writes `profile` into `out` (LayerResult.profile, seconds).
void EncodeLayerProfile(const LayerProfile& profile, v1::LayerProfile* out);

/// Describes every policy of `registry` for ListPolicies: the presets first, then every
/// scorer with every allocator it composes with (PolicyRegistry::CheckComposable) as
/// "SCORER+ALLOCATOR", plus the part names. Each policy lists its output shapes
/// (PolicyRegistry::OutputShapes) and the numerics modes `backend` computes it in
/// (Backend::NumericsModes), FAST before EXACT.
void EncodePolicies(const PolicyRegistry& registry, const Backend& backend,
                    v1::ListPoliciesResponse* out);

}  // namespace kvtrim::service
