// Typed values of the scorers' enumerated parameters (policy.params.pooling, .anchor),
// parsed once from the resolved text and read by both backends.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvtrim {

/// The pooling operator of the window-attention scorers (SnapKV, DropKV).
enum class PoolKind {
  kMax,  // max over the window clipped at the sequence ends (-inf padding)
  kAvg,  // PyTorch avg_pool1d default: zero padding, always divided by the kernel size
};

/// Parses "max" or "avg"; nullopt for anything else.
std::optional<PoolKind> ParsePoolKind(std::string_view name);

/// Parses `name` and checks `kernel` for a scorer: INVALID_ARGUMENT naming `scorer` for an
/// unknown pooling name or a kernel that is not odd and >= 1.
absl::StatusOr<PoolKind> ResolvePooling(const char* scorer, const std::string& name,
                                        int64_t kernel);

/// The anchor KeyDiff compares every key with (keydiff.md §1, §7.1).
enum class KeyDiffAnchor {
  kNormalizedMean,  // mean of the unit keys k_i / ||k_i|| (the project default)
  kRawMean,         // mean of the raw keys
};

/// Parses the `anchor` parameter: "normalized_mean" or "raw_mean". INVALID_ARGUMENT
/// otherwise, naming the value.
absl::StatusOr<KeyDiffAnchor> ParseKeyDiffAnchor(std::string_view text);

}  // namespace kvtrim
