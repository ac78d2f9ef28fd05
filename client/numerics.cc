#include "client/numerics.h"

#include "absl/strings/str_cat.h"

namespace kvtrim {

absl::StatusOr<v1::Numerics> ParseNumericsFlag(absl::string_view text) {
  if (text.empty()) return v1::NUMERICS_UNSPECIFIED;
  if (text == "fast") return v1::NUMERICS_FAST;
  if (text == "exact") return v1::NUMERICS_EXACT;
  return absl::InvalidArgumentError(absl::StrCat(
      "--numerics: \"", text, "\" is not fast or exact (leave it empty for the server default)"));
}

const char* NumericsLabel(v1::Numerics mode) {
  switch (mode) {
    case v1::NUMERICS_UNSPECIFIED:
      return "default";
    case v1::NUMERICS_FAST:
      return "fast";
    case v1::NUMERICS_EXACT:
      return "exact";
    default:
      return "unknown";
  }
}

}  // namespace kvtrim
