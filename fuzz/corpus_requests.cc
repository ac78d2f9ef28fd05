#include "fuzz/corpus_requests.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/chunk_framing.h"
#include "fuzz/records.h"
#include "base/dtype.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::fuzz {
namespace {

/// The size and dtype of seed layers.
struct LayerShape {
  int64_t n = 24;                     // tokens
  int64_t w = 8;                      // query rows (the policies' window param)
  v1::DType dtype = v1::DTYPE_F32;
};

/// LU-KV's profile was built with window 32: its layers send 32 query rows.
constexpr LayerShape kProfileLayer{48, 32, v1::DTYPE_BF16};

/// Rows [begin, begin + count) of the middle axis of an F32 tensor [a, b, c], as `dtype`.
v1::Tensor Slice(const SafetensorsTensor& tensor, int64_t begin, int64_t count,
                 v1::DType dtype) {
  const int64_t a = tensor.shape[0], b = tensor.shape[1], c = tensor.shape[2];
  const float* values = reinterpret_cast<const float*>(tensor.data.data());
  std::string bytes;
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = begin; j < begin + count; ++j) {
      for (int64_t k = 0; k < c; ++k) {
        const float v = values[(i * b + j) * c + k];
        if (dtype == v1::DTYPE_F32) {
          bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
          continue;
        }
        const uint16_t half = dtype == v1::DTYPE_F16 ? FloatToF16(v) : FloatToBf16(v);
        bytes.append(reinterpret_cast<const char*>(&half), sizeof half);
      }
    }
  }
  v1::Tensor out;
  out.set_dtype(dtype);
  for (int64_t extent : {a, count, c}) out.add_shape(extent);
  out.set_inline_data(std::move(bytes));
  return out;
}

/// Layer `id` of the sample prefill: keys and values of the first shape.n tokens, the last
/// shape.w query rows.
v1::LayerInput SampleLayer(const SafetensorsFile& prefill, int id, const LayerShape& shape) {
  const std::string prefix = absl::StrCat("layer.", id, ".");
  const SafetensorsTensor& queries = prefill.tensors.at(prefix + "queries");
  v1::LayerInput layer;
  layer.set_layer_id(id);
  *layer.mutable_keys() = Slice(prefill.tensors.at(prefix + "keys"), 0, shape.n, shape.dtype);
  *layer.mutable_values() =
      Slice(prefill.tensors.at(prefix + "values"), 0, shape.n, shape.dtype);
  *layer.mutable_queries() = Slice(queries, queries.shape[1] - shape.w, shape.w, shape.dtype);
  return layer;
}

/// The scorer and allocator of `policy` (a preset or "SCORER+ALLOCATOR").
std::pair<const ScorerSpec*, const AllocatorSpec*> Parts(const PolicyRegistry& registry,
                                                         const std::string& policy) {
  const size_t plus = policy.find('+');
  std::string scorer = policy.substr(0, plus);
  std::string allocator = plus == std::string::npos ? "uniform" : policy.substr(plus + 1);
  for (const PolicyPreset& preset : registry.presets()) {
    if (preset.name == policy) {
      scorer = preset.scorer;
      allocator = preset.allocator;
    }
  }
  return {registry.FindScorer(scorer), registry.FindAllocator(allocator)};
}

/// True when the allocator of `policy` reads a LU-KV profile.
bool UsesProfile(const PolicyRegistry& registry, const std::string& policy) {
  return (Parts(registry, policy).second->required_inputs & kInputProfile) != 0;
}

/// The layer shape `policy`'s seeds send.
LayerShape ShapeFor(const PolicyRegistry& registry, const std::string& policy) {
  return UsesProfile(registry, policy) ? kProfileLayer : LayerShape{};
}

/// Settings of `policy` keeping half the tokens: every parameter at its default but the
/// window (the seeds' query rows); the sample model when the policy needs it.
v1::CompressionSettings Settings(const PolicyRegistry& registry, const std::string& policy,
                                 const std::string& digest) {
  const auto [scorer, allocator] = Parts(registry, policy);
  v1::CompressionSettings settings;
  settings.mutable_policy()->set_name(policy);
  settings.mutable_budget()->set_keep_fraction(0.5);
  if (((scorer->required_inputs | allocator->required_inputs) &
       (kInputModel | kInputProfile)) != 0) {
    settings.set_model_digest(digest);
  }
  auto* params = settings.mutable_policy()->mutable_params();
  for (const ParamSpec& param : PolicyRegistry::CombinedParams(*scorer, *allocator)) {
    if (param.name == "window") {
      (*params)[param.name].set_number(static_cast<double>(ShapeFor(registry, policy).w));
    } else if (param.kind == ParamSpec::Kind::kEnum) {
      (*params)[param.name].set_text(param.default_text);
    } else if (param.kind == ParamSpec::Kind::kBool) {
      (*params)[param.name].set_flag(param.default_number != 0);
    } else {
      (*params)[param.name].set_number(param.default_number);
    }
  }
  return settings;
}

/// True when `policy` decides over every layer at once (model-wide seeds send two).
bool ModelWide(const PolicyRegistry& registry, const std::string& policy) {
  const auto [scorer, allocator] = Parts(registry, policy);
  return scorer->scope == DecisionScope::kModel || allocator->scope == DecisionScope::kModel;
}

/// A request of `settings` over layers 0 .. layers-1.
std::string Request(const SafetensorsFile& prefill, const v1::CompressionSettings& settings,
                    int layers, const LayerShape& shape) {
  v1::CompressRequest request;
  *request.mutable_settings() = settings;
  for (int id = 0; id < layers; ++id) *request.add_layers() = SampleLayer(prefill, id, shape);
  return request.SerializeAsString();
}

/// The seed request of `policy`.
std::string PolicyRequest(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                          const std::string& policy, const std::string& digest) {
  return Request(prefill, Settings(registry, policy, digest),
                 ModelWide(registry, policy) ? 2 : 1, ShapeFor(registry, policy));
}

/// The bytes of a ByteBuffer.
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  buffer.Dump(&slices).IgnoreError();
  std::string out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

/// One session message as a record.
void Append(const v1::SessionRequest& message, std::string* stream) {
  AppendRecord(message.SerializeAsString(), stream);
}

/// A session of `policy`: begin, layers 0 .. layers-1 inline, finish.
std::string InlineSession(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                          const std::string& policy, const std::string& digest, int layers) {
  std::string stream;
  v1::SessionRequest message;
  *message.mutable_begin() = Settings(registry, policy, digest);
  Append(message, &stream);
  for (int id = 0; id < layers; ++id) {
    message.Clear();
    *message.mutable_layer() = SampleLayer(prefill, id, ShapeFor(registry, policy));
    Append(message, &stream);
  }
  message.Clear();
  message.mutable_finish();
  Append(message, &stream);
  return stream;
}

/// A dropkv session whose layers' tensors are all chunked, in chunks of `chunk_bytes`
/// framed as the C++ client frames them.
std::string ChunkedSession(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                           int layers, size_t chunk_bytes) {
  std::string stream;
  v1::SessionRequest message;
  *message.mutable_begin() = Settings(registry, "dropkv", "");
  Append(message, &stream);
  for (int id = 0; id < layers; ++id) {
    v1::LayerInput layer = SampleLayer(prefill, id, LayerShape{});
    v1::Tensor* tensors[3] = {layer.mutable_keys(), layer.mutable_values(),
                              layer.mutable_queries()};
    std::string data[3];
    for (int slot = 0; slot < 3; ++slot) {
      data[slot] = tensors[slot]->inline_data();
      tensors[slot]->mutable_chunked()->set_total_bytes(data[slot].size());
    }
    message.Clear();
    *message.mutable_layer() = layer;
    Append(message, &stream);
    for (int slot = 0; slot < 3; ++slot) {
      for (size_t offset = 0; offset < data[slot].size(); offset += chunk_bytes) {
        const size_t size = std::min(chunk_bytes, data[slot].size() - offset);
        AppendRecord(Bytes(FrameTensorChunk(id, static_cast<v1::TensorSlot>(slot + 1), offset,
                                            data[slot].data() + offset, size)),
                     &stream);
      }
    }
  }
  message.Clear();
  message.mutable_finish();
  Append(message, &stream);
  return stream;
}

}  // namespace

Seeds CompressRequestSeeds(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                           const std::string& digest) {
  Seeds seeds;
  for (const PolicyPreset& preset : registry.presets()) {
    seeds["preset_" + preset.name] = PolicyRequest(prefill, registry, preset.name, digest);
  }
  for (const AllocatorSpec* allocator : registry.allocators()) {
    seeds["compose_snapkv_" + allocator->name] =
        PolicyRequest(prefill, registry, "snapkv+" + allocator->name, digest);
  }
  const v1::CompressionSettings base = Settings(registry, "snapkv", "");
  seeds["dtype_f16"] = Request(prefill, base, 1, {24, 8, v1::DTYPE_F16});
  seeds["dtype_bf16"] = Request(prefill, base, 1, {24, 8, v1::DTYPE_BF16});
  v1::CompressionSettings s = base;
  s.mutable_budget()->set_keep_tokens(12);
  s.set_sink_tokens(2);
  s.set_recent_tokens(2);
  seeds["keep_tokens_sink_recent"] = Request(prefill, s, 1, {});
  s = base;
  s.set_output_shape(v1::SHARED);
  s.set_answer_encoding(v1::ANSWER_ENCODING_PACKED);
  seeds["shared_packed"] = Request(prefill, s, 2, {});
  s = base;
  s.set_numerics(v1::NUMERICS_EXACT);
  s.set_perturbation(v1::PERTURBATION_SAMPLED);
  s.set_profile(true);
  s.set_request_id("seed");
  seeds["exact_sampled_profile"] = Request(prefill, s, 1, {});
  s = Settings(registry, "random", "");
  s.set_seed(7);
  s.set_perturbation(v1::PERTURBATION_OFF);
  s.set_num_layers(5);
  seeds["random_seeded"] = Request(prefill, s, 3, {});
  return seeds;
}

Seeds SessionSeeds(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                   const std::string& digest) {
  return {{"inline_snapkv", InlineSession(prefill, registry, "snapkv", digest, 2)},
          {"inline_laprox", InlineSession(prefill, registry, "laprox", digest, 2)},
          {"inline_lukv", InlineSession(prefill, registry, "lukv", digest, 1)},
          {"chunked_dropkv_1k", ChunkedSession(prefill, registry, 1, 1024)},
          {"chunked_dropkv_small", ChunkedSession(prefill, registry, 2, 300)}};
}

}  // namespace kvtrim::fuzz
