// Turns tensors named layer.{i}.keys|values|queries into kvtrim.v1.LayerInput messages.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim {

/// The proto tensor of `tensor`: same dtype and shape, its bytes inline.
v1::Tensor ToProtoTensor(const SafetensorsTensor& tensor);

/// One LayerInput per layer found in `file`, ordered by layer id. A layer is the tensors
///   layer.{i}.keys     [H_kv, n, d]   required
///   layer.{i}.values   [H_kv, n, d]   optional
///   layer.{i}.queries  [H_q, w, d]    optional
/// with i a non-negative decimal integer; other tensor names are ignored. Shapes are checked
/// by the server. INVALID_ARGUMENT naming the tensor when values or queries come without
/// keys, or i is not a valid int32; NOT_FOUND when the file holds no layer at all.
absl::StatusOr<std::vector<v1::LayerInput>> LayerInputsFromSafetensors(
    const SafetensorsFile& file);

}  // namespace kvtrim
