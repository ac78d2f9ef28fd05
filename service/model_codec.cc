#include "service/model_codec.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "nlohmann/json.hpp"

namespace kvtrim::service {

namespace {

/// Most profiles one model may carry.
constexpr size_t kMaxProfiles = 256;
/// Longest weight name accepted.
constexpr size_t kMaxNameLength = 256;
/// Longest header.rope_scaling_json accepted (a config.json's rope_scaling is ~200 bytes).
constexpr size_t kMaxRopeScalingJsonBytes = 4096;
/// Longest header.rope_layout accepted ("rotate_half" or "interleaved").
constexpr size_t kMaxRopeLayoutBytes = 32;
/// Longest LU-KV profile manifest accepted (its three keys take ~50 bytes).
constexpr size_t kMaxProfileManifestBytes = 4096;
/// Highest tensor rank accepted (W_O is 2, query_cov and profiles are 3).
constexpr int kMaxRank = 4;

constexpr char kProfilePrefix[] = "profile.";

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

/// OK when `name` has the form of a weight name; `num_layers` bounds layers.{l}.
absl::Status CheckWeightName(const std::string& name, int64_t num_layers,
                             const std::string& field) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "weights[].name: empty; every chunk names its weight (layers.{l}.w_o, ...)");
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".name: longer than ", kMaxNameLength, " characters"));
  }
  if (absl::StartsWith(name, kProfilePrefix)) {
    if (name.size() == sizeof(kProfilePrefix) - 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: the profile name is empty"));
    }
    return absl::OkStatus();
  }
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  int64_t layer = -1;
  const bool digits = parts.size() == 3 && !parts[1].empty() &&
                      parts[1].find_first_not_of("0123456789") == std::string::npos;
  if (!digits || parts[0] != "layers" || !absl::SimpleAtoi(parts[1], &layer) ||
      (parts[2] != "w_o" && parts[2] != "query_mean" && parts[2] != "query_cov")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".name: unknown weight; expected layers.{l}.w_o, layers.{l}.query_mean, "
               "layers.{l}.query_cov or profile.{name}"));
  }
  if (layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".name: layer ", layer, " is not below header.num_layers=", num_layers));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> DecodeDType(v1::DType dtype, const std::string& field) {
  switch (dtype) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_F16: return DType::kF16;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: DTYPE_UNSPECIFIED; the first chunk of a weight names its dtype "
                 "(f32, f16, bf16)"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".dtype: unknown dtype ", static_cast<int>(dtype)));
  }
}

v1::DType EncodeDType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kF16: return v1::DTYPE_F16;
    case DType::kBF16: return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<ProfileManifest> ParseProfileManifest(const std::string& json,
                                                     const std::string& field) {
  ProfileManifest manifest;
  if (json.empty()) return manifest;
  if (json.size() > kMaxProfileManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", json.size(),
                                                   " bytes, longer than the limit of ",
                                                   kMaxProfileManifestBytes, ": ",
                                                   QuoteClientText(json)));
  }
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not a JSON object: ", QuoteClientText(json)));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "metric") {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".metric: must be a string"));
      }
      manifest.metric = it->get<std::string>();
    } else if (key == "sink" || key == "window") {
      if (!it->is_number_integer() || it->get<int64_t>() < 0) {
        // A value is quoted only when it is a scalar: dump() recurses per nesting level,
        // and a client's deeply nested array overflowed the stack.
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".", key, ": must be an integer >= 0, got ",
                         it->is_primitive() ? QuoteClientText(it->dump())
                                            : std::string("a JSON ") + it->type_name()));
      }
      (key == "sink" ? manifest.sink : manifest.window) = it->get<int64_t>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown key ", QuoteClientText(key), " (known: metric, sink, window)"));
    }
  }
  return manifest;
}

std::string CanonicalManifestJson(const ProfileInput& profile) {
  nlohmann::ordered_json j;
  j["metric"] = profile.metric;
  j["sink"] = profile.sink;
  j["window"] = profile.window;
  return j.dump();
}

ModelLayout LayoutFromHeader(const v1::ModelHeader& header) {
  ModelLayout layout;
  layout.name = header.name();
  layout.num_layers = header.num_layers();
  layout.num_query_heads = header.num_query_heads();
  layout.num_kv_heads = header.num_kv_heads();
  layout.head_dim = header.head_dim();
  layout.hidden_size = header.hidden_size();
  return layout;
}

ModelAssembler::ModelAssembler(int64_t max_model_bytes) : max_model_bytes_(max_model_bytes) {}

absl::Status ModelAssembler::Add(const v1::RegisterModelRequest& message) {
  ++messages_;
  switch (message.message_case()) {
    case v1::RegisterModelRequest::kHeader:
      return AddHeader(message.header());
    case v1::RegisterModelRequest::kWeight:
      if (!header_.has_value()) {
        return absl::InvalidArgumentError(
            "header: missing; the first RegisterModelRequest must carry the model header, "
            "the weight chunks follow it");
      }
      return AddChunk(message.weight());
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "message: RegisterModelRequest #", messages_, " is empty; set header or weight"));
  }
}

absl::Status ModelAssembler::AddHeader(const v1::ModelHeader& header) {
  if (header_.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header: sent again in message #", messages_, "; send it exactly once, first"));
  }
  if (messages_ != 1) {
    return absl::InvalidArgumentError("header: must be the first message of the stream");
  }
  const struct {
    const char* field;
    const std::string& text;
    size_t limit;
  } texts[] = {{"header.name", header.name(), kMaxModelNameBytes},
               {"header.rope_scaling_json", header.rope_scaling_json(), kMaxRopeScalingJsonBytes},
               {"header.rope_layout", header.rope_layout(), kMaxRopeLayoutBytes}};
  for (const auto& text : texts) {
    if (text.text.size() > text.limit) {
      return absl::InvalidArgumentError(absl::StrCat(text.field, ": ", text.text.size(),
                                                     " bytes, longer than the limit of ",
                                                     text.limit, ": ", QuoteClientText(text.text)));
    }
  }
  header_ = header;
  return absl::OkStatus();
}

absl::Status ModelAssembler::StartWeight(const v1::ModelWeightChunk& chunk,
                                         const std::string& field, Pending* pending) {
  auto dtype = DecodeDType(chunk.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  if (chunk.shape_size() < 1 || chunk.shape_size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape: the first chunk of a weight carries its full shape (rank 1..",
        kMaxRank, "), got ", ShapeText(chunk.shape())));
  }
  int64_t bytes = static_cast<int64_t>(DTypeSize(*dtype));
  for (int i = 0; i < chunk.shape_size(); ++i) {
    const int64_t extent = chunk.shape(i);
    if (extent < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".shape[", i, "]: must be >= 1, got ", extent));
    }
    if (__builtin_mul_overflow(bytes, extent, &bytes) || bytes > max_model_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          field, ".shape: ", ShapeText(chunk.shape()), " in ", DTypeName(*dtype),
          " exceeds --max_model_bytes=", max_model_bytes_));
    }
  }
  if (declared_bytes_ + bytes > max_model_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ".shape: the weights declared so far need ", declared_bytes_ + bytes,
        " bytes, more than --max_model_bytes=", max_model_bytes_));
  }
  const bool profile = absl::StartsWith(chunk.name(), kProfilePrefix);
  if (!profile && !chunk.manifest_json().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".manifest_json: only profile.{name} weights carry a manifest"));
  }
  if (profile) {
    size_t profiles = 0;
    for (const auto& [name, w] : weights_) profiles += absl::StartsWith(name, kProfilePrefix);
    if (profiles >= kMaxProfiles) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: more than ", kMaxProfiles, " profiles"));
    }
    auto manifest = ParseProfileManifest(chunk.manifest_json(), field + ".manifest_json");
    if (!manifest.ok()) return manifest.status();
  }
  declared_bytes_ += bytes;
  pending->dtype = *dtype;
  pending->shape.assign(chunk.shape().begin(), chunk.shape().end());
  pending->manifest_json = chunk.manifest_json();
  pending->size = static_cast<uint64_t>(bytes);
  pending->bytes.reserve(static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status ModelAssembler::AddChunk(const v1::ModelWeightChunk& chunk) {
  const std::string field = absl::StrCat("weights[", ClientTextInField(chunk.name()), "]");
  KVTRIM_RETURN_IF_ERROR(CheckWeightName(chunk.name(), header_->num_layers(), field));
  auto it = weights_.find(chunk.name());
  if (it == weights_.end()) {
    if (chunk.offset_bytes() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".offset_bytes: ", chunk.offset_bytes(),
          ", but no earlier chunk of this weight arrived; chunks must be sent in order, "
          "starting at offset 0 with the name, dtype and shape"));
    }
    Pending pending;
    KVTRIM_RETURN_IF_ERROR(StartWeight(chunk, field, &pending));
    it = weights_.emplace(chunk.name(), std::move(pending)).first;
  } else {
    Pending& p = it->second;
    const uint64_t next = p.bytes.size();
    if (chunk.offset_bytes() != next) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".offset_bytes: ", chunk.offset_bytes(),
          chunk.offset_bytes() < next ? " overlaps bytes already received"
                                      : " leaves a gap after the bytes received",
          " ([0, ", next, ") of ", p.size,
          "); chunks must be contiguous, in order and sent once"));
    }
    if (chunk.dtype() != v1::DTYPE_UNSPECIFIED && chunk.dtype() != EncodeDType(p.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: differs from the dtype of the weight's first chunk (",
          DTypeName(p.dtype), ")"));
    }
    if (chunk.shape_size() != 0 &&
        !std::equal(chunk.shape().begin(), chunk.shape().end(), p.shape.begin(),
                    p.shape.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".shape: ", ShapeText(chunk.shape()),
          " differs from the shape of the weight's first chunk [", absl::StrJoin(p.shape, ", "),
          "]"));
    }
    if (!chunk.manifest_json().empty() && chunk.manifest_json() != p.manifest_json) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".manifest_json: differs from the manifest of the weight's first chunk"));
    }
  }
  Pending& p = it->second;
  const uint64_t next = p.bytes.size();
  if (chunk.data().size() > p.size - next) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".offset_bytes: the chunk [", next, ", ", next + chunk.data().size(),
        ") runs past the end of the weight (", p.size, " bytes: shape [",
        absl::StrJoin(p.shape, ", "), "] in ", DTypeName(p.dtype), ")"));
  }
  p.bytes.append(chunk.data());
  received_bytes_ += static_cast<int64_t>(chunk.data().size());
  return absl::OkStatus();
}

absl::StatusOr<ModelInput> ModelAssembler::Finish() {
  if (!header_.has_value()) {
    return absl::InvalidArgumentError(
        "header: missing; the stream ended before the model header was sent");
  }
  ModelInput input;
  input.layout = LayoutFromHeader(*header_);
  input.rope_theta = header_->rope_theta();
  input.rope_scaling_json = header_->rope_scaling_json();
  input.rope_layout = header_->rope_layout();
  for (auto& [name, p] : weights_) {
    const std::string field = absl::StrCat("weights[", ClientTextInField(name), "]");
    if (p.bytes.size() != p.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".data: received ", p.bytes.size(), " of ", p.size,
          " bytes; the stream ended before the weight was complete"));
    }
    RawTensor tensor;
    tensor.dtype = p.dtype;
    tensor.shape = std::move(p.shape);
    tensor.bytes = std::move(p.bytes);
    if (absl::StartsWith(name, kProfilePrefix)) {
      auto manifest = ParseProfileManifest(p.manifest_json, field + ".manifest_json");
      if (!manifest.ok()) return manifest.status();
      ProfileInput profile;
      profile.ratios = std::move(tensor);
      profile.metric = manifest->metric;
      profile.sink = manifest->sink;
      profile.window = manifest->window;
      input.profiles.emplace(name.substr(sizeof(kProfilePrefix) - 1), std::move(profile));
    } else {
      input.tensors.emplace(name, std::move(tensor));
    }
  }
  weights_.clear();
  return input;
}

void EncodeModelInfo(const RegisteredModel& model, v1::ModelInfo* info) {
  info->set_digest(model.digest);
  v1::ModelHeader* header = info->mutable_header();
  const ModelLayout& m = model.layout;
  header->set_name(m.name);
  header->set_num_layers(m.num_layers);
  header->set_num_query_heads(m.num_query_heads);
  header->set_num_kv_heads(m.num_kv_heads);
  header->set_head_dim(m.head_dim);
  header->set_hidden_size(m.hidden_size);
  header->set_rope_theta(model.input.rope_theta);
  header->set_rope_scaling_json(model.input.rope_scaling_json);
  header->set_rope_layout(model.input.rope_layout);
  // Both maps are in name order and "layers." < "profile.", so the list is sorted.
  for (const auto& [name, tensor] : model.input.tensors) info->add_weights(name);
  for (const auto& [name, profile] : model.input.profiles) {
    info->add_weights(absl::StrCat(kProfilePrefix, name));
  }
}

}  // namespace kvtrim::service
