#include "kernels/scorer_params.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtrim {

std::optional<PoolKind> ParsePoolKind(std::string_view name) {
  if (name == "max") return PoolKind::kMax;
  if (name == "avg") return PoolKind::kAvg;
  return std::nullopt;
}

absl::StatusOr<PoolKind> ResolvePooling(const char* scorer, const std::string& name,
                                        int64_t kernel) {
  const std::optional<PoolKind> kind = ParsePoolKind(name);
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(scorer, ": pooling '", name, "' is not one of {max, avg}"));
  }
  if (kernel < 1 || kernel % 2 == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(scorer, ": kernel must be odd and >= 1, got ", kernel));
  }
  return *kind;
}

absl::StatusOr<KeyDiffAnchor> ParseKeyDiffAnchor(std::string_view text) {
  if (text == "normalized_mean") return KeyDiffAnchor::kNormalizedMean;
  if (text == "raw_mean") return KeyDiffAnchor::kRawMean;
  return absl::InvalidArgumentError(absl::StrCat("keydiff anchor '", std::string(text),
                                                 "' is not one of {normalized_mean, raw_mean}"));
}

}  // namespace kvtrim
