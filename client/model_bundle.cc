#include "client/model_bundle.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace kvtrim {

namespace {

constexpr char kProfilePrefix[] = "profile.";
constexpr char kManifestSuffix[] = ".manifest";

/// A required int32 metadata value.
absl::Status ReadInt(const std::map<std::string, std::string>& meta, const char* key,
                     const std::string& source, int32_t* out) {
  auto it = meta.find(key);
  if (it == meta.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": __metadata__.", key, " is missing (an integer)"));
  }
  if (!absl::SimpleAtoi(it->second, out)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": __metadata__.", key, ": '",
                                                   it->second, "' is not an integer"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t ModelBundle::WeightBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : weights) bytes += static_cast<int64_t>(tensor.data.size());
  return bytes;
}

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kF16: return v1::DTYPE_F16;
    case DType::kBF16: return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<ModelBundle> ModelBundleFromSafetensors(SafetensorsFile file,
                                                       const std::string& source) {
  ModelBundle bundle;
  const auto& meta = file.metadata;
  v1::ModelHeader& h = bundle.header;
  if (auto it = meta.find("name"); it != meta.end()) h.set_name(it->second);
  int32_t value = 0;
  for (auto [key, setter] :
       {std::pair<const char*, void (v1::ModelHeader::*)(int32_t)>{
            "num_layers", &v1::ModelHeader::set_num_layers},
        {"num_query_heads", &v1::ModelHeader::set_num_query_heads},
        {"num_kv_heads", &v1::ModelHeader::set_num_kv_heads},
        {"head_dim", &v1::ModelHeader::set_head_dim},
        {"hidden_size", &v1::ModelHeader::set_hidden_size}}) {
    KVTRIM_RETURN_IF_ERROR(ReadInt(meta, key, source, &value));
    (h.*setter)(value);
  }
  auto theta = meta.find("rope_theta");
  double rope_theta = 0;
  if (theta == meta.end() || !absl::SimpleAtod(theta->second, &rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": __metadata__.rope_theta is missing or not a number"));
  }
  h.set_rope_theta(rope_theta);
  if (auto it = meta.find("rope_layout"); it != meta.end()) h.set_rope_layout(it->second);
  if (auto it = meta.find("rope_scaling_json"); it != meta.end()) {
    h.set_rope_scaling_json(it->second);
  }
  for (const auto& [key, text] : meta) {
    if (!absl::StartsWith(key, kProfilePrefix) || !absl::EndsWith(key, kManifestSuffix)) continue;
    const std::string weight = key.substr(0, key.size() - (sizeof(kManifestSuffix) - 1));
    if (file.tensors.count(weight) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": __metadata__.", key, ": the file has no tensor \"", weight, "\""));
    }
    bundle.manifests[weight] = text;
  }
  bundle.weights = std::move(file.tensors);
  return bundle;
}

absl::StatusOr<ModelBundle> ReadModelBundle(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) return file.status();
  return ModelBundleFromSafetensors(*std::move(file), path);
}

SafetensorsFile ModelBundleToSafetensors(const ModelBundle& bundle) {
  SafetensorsFile file;
  file.tensors = bundle.weights;
  const v1::ModelHeader& h = bundle.header;
  file.metadata = {
      {"name", h.name()},
      {"num_layers", absl::StrCat(h.num_layers())},
      {"num_query_heads", absl::StrCat(h.num_query_heads())},
      {"num_kv_heads", absl::StrCat(h.num_kv_heads())},
      {"head_dim", absl::StrCat(h.head_dim())},
      {"hidden_size", absl::StrCat(h.hidden_size())},
      {"rope_theta", absl::StrFormat("%.17g", h.rope_theta())},  // round-trips exactly
  };
  if (!h.rope_scaling_json().empty()) file.metadata["rope_scaling_json"] = h.rope_scaling_json();
  if (!h.rope_layout().empty()) file.metadata["rope_layout"] = h.rope_layout();
  for (const auto& [weight, manifest] : bundle.manifests) {
    file.metadata[absl::StrCat(weight, kManifestSuffix)] = manifest;
  }
  return file;
}

absl::Status WriteModelBundle(const std::string& path, const ModelBundle& bundle) {
  return WriteSafetensors(path, ModelBundleToSafetensors(bundle));
}

}  // namespace kvtrim
