// Parsing of the CLI's textual policy parameters and enums into proto values.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::cli {

/// Parses "name=value,name=value,..." (empty text: no parameters). A value is a `flag` for
/// "true" / "false", a `number` when it parses as a double, and `text` otherwise (enum
/// choices such as pooling=max). INVALID_ARGUMENT naming the item for a missing name or
/// '=', or a name given twice.
absl::StatusOr<std::map<std::string, v1::ParamValue>> ParseParams(absl::string_view text);

/// "per_head" -> PER_HEAD, "shared" -> SHARED; INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::OutputShape> ParseOutputShape(absl::string_view text);

}  // namespace kvtrim::cli
