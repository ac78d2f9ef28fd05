// Errors about one tensor of a layer raised below the engine (backends, staging, statistics),
// where the request's field of the layer ("layers[3]", "session.layer") is not known. The
// field relative to the layer ("keys", "keys.shape") travels as data, in a status payload,
// and PolicyEngine prefixes the layer's field to it: nothing matches message text.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvtrim {

/// The payload URL that carries an error's field relative to its layer.
inline constexpr absl::string_view kLayerFieldPayload = "type.kvtrim.dev/kvtrim.LayerField";

/// INVALID_ARGUMENT "<relative_field>: <detail>", carrying `relative_field` (e.g. "keys",
/// "keys.shape", "queries") as its layer-relative field.
absl::Status LayerFieldError(absl::string_view relative_field, absl::string_view detail);

/// `status` carrying `relative_field` as its layer-relative field, when it is an
/// INVALID_ARGUMENT whose message starts with that field (as NonFiniteError's does); any
/// other status unchanged.
absl::Status AsLayerFieldError(absl::Status status, absl::string_view relative_field);

/// "<layer_field>.<message>" (INVALID_ARGUMENT, the payload consumed) for a status that
/// carries a layer-relative field; any other status unchanged.
absl::Status QualifyLayerError(const absl::Status& status, absl::string_view layer_field);

}  // namespace kvtrim
