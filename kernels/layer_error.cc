#include "kernels/layer_error.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvtrim {

absl::Status LayerFieldError(absl::string_view relative_field, absl::string_view detail) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(relative_field, ": ", detail));
  status.SetPayload(kLayerFieldPayload, absl::Cord(relative_field));
  return status;
}

absl::Status AsLayerFieldError(absl::Status status, absl::string_view relative_field) {
  if (status.code() == absl::StatusCode::kInvalidArgument &&
      absl::StartsWith(status.message(), relative_field)) {
    status.SetPayload(kLayerFieldPayload, absl::Cord(relative_field));
  }
  return status;
}

absl::Status QualifyLayerError(const absl::Status& status, absl::string_view layer_field) {
  if (!status.GetPayload(kLayerFieldPayload).has_value()) return status;
  return absl::InvalidArgumentError(absl::StrCat(layer_field, ".", status.message()));
}

}  // namespace kvtrim
