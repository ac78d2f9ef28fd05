// The numerics mode of a request and of an answer (kvtrim.proto's Numerics) as the client
// tools spell it: the --numerics flag of `kvtrim compress` and `kvtrim-loadgen`, and the
// mode they print for each answered layer.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim {

/// Parses a --numerics value: "fast" -> NUMERICS_FAST, "exact" -> NUMERICS_EXACT, "" ->
/// NUMERICS_UNSPECIFIED (the server's --numerics decides). INVALID_ARGUMENT naming
/// --numerics otherwise.
absl::StatusOr<v1::Numerics> ParseNumericsFlag(absl::string_view text);

/// "fast", "exact", "default" (NUMERICS_UNSPECIFIED: the server decides) or "unknown" (a
/// value this client does not know, e.g. from a newer server).
const char* NumericsLabel(v1::Numerics mode);

}  // namespace kvtrim
