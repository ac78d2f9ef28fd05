// A "model bundle": everything kvtrimd needs to register a model (RegisterModel), in one
// safetensors file. Tensors:
//   layers.{l}.w_o         [hidden_size, H_q * d]  output projection of layer l (o_proj.weight)
//   layers.{l}.query_mean  [H_q, d]                pre-RoPE query mean (optional, all layers)
//   layers.{l}.query_cov   [H_q, d, d]             pre-RoPE query covariance (with the mean)
//   profile.{name}         [99, L, H_kv]           LU-KV budget curves (optional)
// __metadata__ (strings): name, num_layers, num_query_heads, num_kv_heads, head_dim,
// hidden_size, rope_theta, rope_scaling_json and rope_layout (optional), and per profile
// "profile.{name}.manifest" = its JSON manifest, e.g. {"metric":"snapkv","sink":4,"window":32}.
// Other metadata keys are ignored (kvtrimd's own <hex>.kvtmodel files are bundles too).
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/safetensors.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim {

/// One model as the client registers it.
struct ModelBundle {
  /// Head layout and RoPE parameters (sent as the stream's first message).
  v1::ModelHeader header;
  /// Every weight by registration name ("layers.0.w_o", "profile.snapkv", ...).
  std::map<std::string, SafetensorsTensor> weights;
  /// Manifest JSON by profile weight name ("profile.snapkv" -> "{...}"); a profile without
  /// an entry is sent with an empty manifest.
  std::map<std::string, std::string> manifests;

  /// Sum of the weights' bytes.
  int64_t WeightBytes() const;
};

/// The proto dtype of a safetensors dtype.
v1::DType ToProtoDType(DType dtype);

/// A bundle from a parsed safetensors file. INVALID_ARGUMENT starting with `source` and
/// naming the key: a missing or non-integer header field, a rope_theta that is not a number,
/// a manifest whose profile tensor is missing. Tensor names and shapes are the server's to
/// check (it names the offending weight).
absl::StatusOr<ModelBundle> ModelBundleFromSafetensors(SafetensorsFile file,
                                                       const std::string& source);

/// Reads a bundle file (ReadSafetensors + ModelBundleFromSafetensors).
absl::StatusOr<ModelBundle> ReadModelBundle(const std::string& path);

/// The safetensors form of `bundle` (the inverse of ModelBundleFromSafetensors).
SafetensorsFile ModelBundleToSafetensors(const ModelBundle& bundle);

/// Writes `bundle` to `path` (replacing it).
absl::Status WriteModelBundle(const std::string& path, const ModelBundle& bundle);

}  // namespace kvtrim
