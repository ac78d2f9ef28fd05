// Decoding of proto CompressionSettings into kernel settings, with the proto-level checks.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kernels/layer.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::service {

/// Converts proto settings to kernel settings. `field` is the message field that holds the
/// settings ("settings" in Compress, "begin" in sessions); errors name its sub-fields:
///   "<field>.budget"                  missing budget                  INVALID_ARGUMENT
///   "<field>.budget.keep_fraction"    NaN, <= 0 or > 1                INVALID_ARGUMENT
///   "<field>.budget.keep_tokens"      < 1                             INVALID_ARGUMENT
///   "<field>.budget.max_perturbation.epsilon"   NaN, Inf or < 0       INVALID_ARGUMENT
///   "<field>.budget.max_perturbation.max_keep_fraction"  NaN, < 0, > 1 INVALID_ARGUMENT
///                                     (0 = 1: the cap is every token)
///   "<field>.sink_tokens" / ".recent_tokens"   negative               INVALID_ARGUMENT
///   "<field>.num_layers"              negative                        INVALID_ARGUMENT
///   "<field>.output_shape"            BLOCK_ALIGNED / EQUAL_COUNT     UNIMPLEMENTED
///                                     unknown enum value              INVALID_ARGUMENT
///   "<field>.policy.params.<name>"    no value set                    INVALID_ARGUMENT
///   "<field>.numerics"                unknown enum value              INVALID_ARGUMENT
/// NUMERICS_UNSPECIFIED becomes `default_numerics` (the server's --numerics).
/// Policy name and parameter values are resolved later by the registry (PolicyEngine).
/// `model_digest` is not part of the kernel settings; the service checks it.
absl::StatusOr<CompressionSettings> DecodeSettings(const v1::CompressionSettings& settings,
                                                   const std::string& field,
                                                   Numerics default_numerics);

}  // namespace kvtrim::service
