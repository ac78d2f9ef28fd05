#include "client/layer_inputs.h"

#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtrim {

v1::Tensor ToProtoTensor(const SafetensorsTensor& tensor) {
  v1::Tensor out;
  switch (tensor.dtype) {
    case DType::kF32:
      out.set_dtype(v1::DTYPE_F32);
      break;
    case DType::kF16:
      out.set_dtype(v1::DTYPE_F16);
      break;
    case DType::kBF16:
      out.set_dtype(v1::DTYPE_BF16);
      break;
  }
  for (int64_t extent : tensor.shape) out.add_shape(extent);
  out.set_inline_data(tensor.data);
  return out;
}

absl::StatusOr<std::vector<v1::LayerInput>> LayerInputsFromSafetensors(
    const SafetensorsFile& file) {
  std::map<int32_t, v1::LayerInput> layers;
  for (const auto& [name, tensor] : file.tensors) {
    std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
    if (parts.size() != 3 || parts[0] != "layer") continue;
    if (parts[2] != "keys" && parts[2] != "values" && parts[2] != "queries") continue;
    int32_t id = -1;
    if (parts[1].empty() || parts[1].find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(parts[1], &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": layer index is not a non-negative int32"));
    }
    v1::LayerInput& layer = layers[id];
    layer.set_layer_id(id);
    if (parts[2] == "keys") {
      *layer.mutable_keys() = ToProtoTensor(tensor);
    } else if (parts[2] == "values") {
      *layer.mutable_values() = ToProtoTensor(tensor);
    } else {
      *layer.mutable_queries() = ToProtoTensor(tensor);
    }
  }
  if (layers.empty()) {
    return absl::NotFoundError("no tensor named layer.{i}.keys in the file");
  }
  std::vector<v1::LayerInput> out;
  out.reserve(layers.size());
  for (auto& [id, layer] : layers) {
    if (!layer.has_keys()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer.", id, ": values or queries given without layer.", id, ".keys"));
    }
    out.push_back(std::move(layer));
  }
  return out;
}

}  // namespace kvtrim
