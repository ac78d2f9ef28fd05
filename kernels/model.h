// A registered model: head layout, RoPE, output projections (W_O), optional pre-RoPE query
// statistics and optional LU-KV budget profiles. Built once from the tensors a client
// registers (BuildModel), immutable afterwards and shared by every request that names its
// digest. No gRPC here: the service decodes, digests and persists; this file validates and
// derives what the scorers read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/dtype.h"

namespace kvtrim {

/// RoPE frequencies of a model (Hugging Face `rotate_half` convention: dimension i pairs
/// with i + d/2 and turns by position * inv_freq[i]).
struct RopeConfig {
  double theta = 10000.0;             // rope_theta
  std::string scaling_type = "none";  // "none", "linear", "llama3"
  double factor = 1.0;                // linear and llama3
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  double original_max_position = 8192;  // llama3: original_max_position_embeddings
  bool interleaved = false;           // pairs (2i, 2i+1) instead of (i, i + d/2)

  /// The partner dimension index of pair i (i < d/2): (first, second) components.
  std::pair<int64_t, int64_t> PairDims(int64_t i, int64_t head_dim) const {
    return interleaved ? std::pair<int64_t, int64_t>{2 * i, 2 * i + 1}
                       : std::pair<int64_t, int64_t>{i, i + head_dim / 2};
  }

  /// Inverse frequencies inv_freq[0 .. head_dim/2) in double precision after scaling.
  std::vector<double> InverseFrequencies(int64_t head_dim) const;
};

/// Parses the `rope_scaling` object of a Hugging Face config.json ("" or "null" = none).
/// Errors: INVALID_ARGUMENT naming `field` (bad JSON, unknown rope_type, bad factor).
absl::StatusOr<RopeConfig> ParseRopeScaling(double theta, const std::string& json,
                                            const std::string& field);

/// Head layout of a model.
struct ModelLayout {
  std::string name;
  int32_t num_layers = 0;       // L
  int32_t num_query_heads = 0;  // H_q
  int32_t num_kv_heads = 0;     // H_kv
  int32_t head_dim = 0;         // d
  int32_t hidden_size = 0;      // D (rows of o_proj.weight)
  int32_t group_size() const { return num_kv_heads ? num_query_heads / num_kv_heads : 0; }
};

/// One LU-KV profile: local prune ratios per global ratio (lukv.md §5.2), with the scorer
/// configuration it was built for.
struct LukvProfile {
  std::string name;       // registered as "profile.<name>"
  std::string metric;     // the wrapped scorer, e.g. "snapkv"
  int64_t sink = 0;       // protected first tokens the profile was built with
  int64_t window = 0;     // protected last tokens the profile was built with
  std::vector<float> prune_ratios;  // [99, L, H_kv]: row k is global evicted ratio (k+1)/100

  /// Local prune ratio of (row, layer, head).
  float ratio(int64_t row, int64_t layer, int64_t head, int64_t num_layers,
              int64_t num_kv_heads) const {
    return prune_ratios[static_cast<size_t>((row * num_layers + layer) * num_kv_heads + head)];
  }
};

/// Rows of a LU-KV profile (global ratios 0.01 .. 0.99).
constexpr int64_t kLukvProfileRows = 99;

/// A raw tensor as registered (before conversion): dtype, shape and little-endian bytes.
struct RawTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// A profile as registered: the [99, L, H_kv] tensor plus its manifest fields.
struct ProfileInput {
  RawTensor ratios;
  std::string metric;
  int64_t sink = 0;
  int64_t window = 0;
};

/// Everything a client registers, before validation.
struct ModelInput {
  ModelLayout layout;
  double rope_theta = 10000.0;
  std::string rope_scaling_json;
  std::string rope_layout;   // "rotate_half" (default, also "") or "interleaved"
  std::map<std::string, RawTensor> tensors;         // "layers.{l}.w_o", "layers.{l}.query_mean",
                                                    // "layers.{l}.query_cov"
  std::map<std::string, ProfileInput> profiles;     // by name (without "profile.")
};

/// A validated, immutable model. Per-layer arrays are fp32, row-major.
struct RegisteredModel {
  std::string digest;     // "sha256:<hex>", set by the service
  ModelLayout layout;
  RopeConfig rope;
  std::string rope_scaling_json;
  /// [L][D, H_q * d]: o_proj.weight (y = x W^T). W_O^h = w_o[:, h*d:(h+1)*d]^T is [d, D], so
  /// ||v W_O^h||_1 = sum_e |<v, w_o[e, h*d : h*d + d]>| reads contiguous rows.
  std::vector<std::vector<float>> w_o;
  /// [L][H_q, d, d]: Gram_h = W_O^h W_O^h^T (double accumulation, rounded once to fp32).
  std::vector<std::vector<float>> head_gram;
  /// [L][H_kv, d, d]: (sum_{h in group} W_O^h)(sum_h W_O^h)^T (LaProx GQA option c).
  std::vector<std::vector<float>> group_gram;
  /// [L][H_q, d] pre-RoPE query mean, or empty vectors when not registered.
  std::vector<std::vector<float>> query_mean;
  /// [L][H_q, d, d] pre-RoPE query covariance, or empty vectors when not registered.
  std::vector<std::vector<float>> query_cov;
  std::map<std::string, LukvProfile> profiles;
  /// The tensors exactly as registered (for persistence and ListModels).
  ModelInput input;

  bool has_query_stats() const { return !query_mean.empty() && !query_mean[0].empty(); }
  /// The profile named `name`, or nullptr.
  const LukvProfile* FindProfile(const std::string& name) const;
};

/// Validates `input` against its layout and derives the fp32 arrays and Gram matrices.
/// Errors are INVALID_ARGUMENT naming the field ("header.num_kv_heads", "weights[layers.3.w_o]
/// .shape", "weights[profile.snapkv].shape", ...): W_O for every layer is required and must be
/// [D, H_q*d]; query_mean/query_cov are all-or-none over the layers; profiles must be
/// [99, L, H_kv] with ratios in [0, 1]; dtypes f32/f16/bf16; NaN/Inf refused.
absl::StatusOr<std::shared_ptr<RegisteredModel>> BuildModel(ModelInput input);

/// BuildModel without keeping the tensors: the same checks and derived arrays, `input` only
/// read (so other readers may run beside it), RegisteredModel::input left empty for the
/// caller to move in.
absl::StatusOr<std::shared_ptr<RegisteredModel>> BuildModelFrom(const ModelInput& input);

}  // namespace kvtrim
