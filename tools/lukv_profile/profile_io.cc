#include "tools/lukv_profile/profile_io.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "formats/safetensors.h"
#include "kernels/lukv/greedy_solver.h"
#include "nlohmann/json.hpp"

namespace kvtrim {
namespace {

/// The tensor `name` of `file` as fp32 [shape0, shape1, shape2] (rank 2 is read as
/// [1, s0, s1]); INVALID_ARGUMENT when it is missing or has another rank.
absl::StatusOr<F32Tensor> Tensor(const SafetensorsFile& file, const std::string& name,
                                 size_t rank, const std::string& source) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", name, " is missing"));
  }
  const SafetensorsTensor& t = it->second;
  if (t.shape.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", name, " has rank ",
                                                   t.shape.size(), ", expected ", rank));
  }
  TensorView view;
  view.data = t.data.data();
  view.dtype = t.dtype;
  view.shape = rank == 3 ? std::array<int64_t, 3>{t.shape[0], t.shape[1], t.shape[2]}
                         : std::array<int64_t, 3>{1, t.shape[0], t.shape[1]};
  return F32Tensor::FromView(view);
}

/// The integer metadata value `key`; INVALID_ARGUMENT when missing or not an integer.
absl::StatusOr<int64_t> MetaInt(const SafetensorsFile& file, const std::string& key,
                                const std::string& source) {
  auto it = file.metadata.find(key);
  int64_t value = 0;
  if (it == file.metadata.end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": __metadata__.", key, " must be an integer string",
        it == file.metadata.end() ? " (missing)" : absl::StrCat(", got \"", it->second, "\"")));
  }
  return value;
}

}  // namespace

absl::StatusOr<lukv::CalibrationDump> ReadCalibrationDump(const std::string& path) {
  auto read = ReadSafetensors(path);
  if (!read.ok()) return read.status();
  auto file = std::make_shared<const SafetensorsFile>(*std::move(read));
  lukv::CalibrationDump dump;
  dump.source = path;
  dump.owner = file;
  int64_t L = 0;
  while (file->tensors.count(absl::StrCat("layers.", L, ".keys"))) ++L;
  if (L == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no layers.0.keys tensor"));
  }
  for (int64_t l = 0; l < L; ++l) {
    const std::string prefix = absl::StrCat("layers.", l, ".");
    auto k = Tensor(*file, prefix + "keys", 3, path);
    if (!k.ok()) return k.status();
    auto v = Tensor(*file, prefix + "values", 3, path);
    if (!v.ok()) return v.status();
    auto q = Tensor(*file, prefix + "queries", 3, path);
    if (!q.ok()) return q.status();
    dump.keys.push_back(*std::move(k));
    dump.values.push_back(*std::move(v));
    dump.queries.push_back(*std::move(q));
  }
  auto T = MetaInt(*file, "context_length", path);
  if (!T.ok()) return T.status();
  auto S = MetaInt(*file, "decode_start", path);
  if (!S.ok()) return S.status();
  if (auto it = file->metadata.find("softmax_scale"); it != file->metadata.end()) {
    if (!absl::SimpleAtof(it->second, &dump.softmax_scale) || !(dump.softmax_scale > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": __metadata__.softmax_scale must be a positive number, got \"", it->second,
          "\""));
    }
  }
  dump.dims.num_layers = L;
  dump.dims.num_kv_heads = dump.keys[0].dim(0);
  dump.dims.num_tokens = dump.keys[0].dim(1);
  dump.dims.head_dim = dump.keys[0].dim(2);
  dump.dims.num_query_heads = dump.queries[0].dim(0);
  dump.dims.context_length = *T;
  dump.dims.decode_start = *S;
  KVTRIM_RETURN_IF_ERROR(dump.Validate());
  return dump;
}

absl::StatusOr<lukv::ModelWeights> ReadModelWeights(const std::string& path) {
  auto read = ReadSafetensors(path);
  if (!read.ok()) return read.status();
  auto file = std::make_shared<const SafetensorsFile>(*std::move(read));
  lukv::ModelWeights model;
  model.owner = file;
  auto name = file->metadata.find("name");
  model.name = name == file->metadata.end() ? "" : name->second;
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"num_layers", &model.num_layers},
                            {"num_query_heads", &model.num_query_heads},
                            {"num_kv_heads", &model.num_kv_heads},
                            {"head_dim", &model.head_dim},
                            {"hidden_size", &model.hidden_size}}) {
    auto value = MetaInt(*file, key, path);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  for (int64_t l = 0; l < model.num_layers; ++l) {
    auto w = Tensor(*file, absl::StrCat("layers.", l, ".w_o"), 2, path);
    if (!w.ok()) return w.status();
    model.w_o.push_back(*std::move(w));
  }
  if (auto st = model.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  }
  return model;
}

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

std::string ProfileManifestJson(const lukv::ProfileBuilder& builder, const NpyArray& profile,
                                const std::vector<std::string>& dump_paths) {
  const lukv::ProfileConfig& config = builder.config();
  const lukv::ModelWeights& model = builder.model();
  nlohmann::ordered_json params = nlohmann::ordered_json::object();
  for (const auto& [name, value] : builder.ScorerParams()) {
    if (value.is_text) {
      params[name] = value.text;
    } else {
      params[name] = value.number;
    }
  }
  const std::vector<int64_t>& lengths = builder.context_lengths();
  nlohmann::ordered_json calib_t;
  if (!lengths.empty() && std::all_of(lengths.begin(), lengths.end(),
                                      [&](int64_t t) { return t == lengths[0]; })) {
    calib_t = lengths[0];
  } else {
    calib_t = lengths;  // one T per dump when they differ
  }
  nlohmann::ordered_json dumps = nlohmann::ordered_json::array();
  for (const std::string& p : dump_paths) dumps.push_back(p.substr(p.find_last_of('/') + 1));
  nlohmann::ordered_json m;
  m["format"] = "kvtrim.lukv_profile.v1";
  m["model"] = model.name;
  m["model_id"] = model.name;
  m["num_layers"] = model.num_layers;
  m["num_kv_heads"] = model.num_kv_heads;
  m["metric"] = config.metric;
  m["metric_params"] = params;
  m["sink"] = config.sink;
  m["window"] = config.window;
  m["recent_window"] = config.window;
  m["grid"] = "0.01:0.99:0.01";
  m["rows"] = lukv::kGridRows;
  m["entry"] = "local evicted (prune) ratio r of [k, layer, kv_head] for global ratio (k+1)/100";
  m["calib_T"] = calib_t;
  m["M"] = builder.num_dumps();
  m["min_retention"] = 0.01;
  m["oracle_norm"] = "l2";
  m["gqa_agg"] = lukv::GqaAggregationName(config.oracle.gqa);
  m["layer_norm"] = true;
  m["k_max"] = config.oracle.k_max;
  m["decode_steps"] = "answer tokens: positions decode_start .. decode_start + k_max - 1";
  m["shape"] = profile.shape;
  m["dtype"] = "<f4";
  m["dumps"] = dumps;
  m["sha256"] = Sha256Hex(NpyDataBytes(profile));
  m["sha256_of"] = "the array's little-endian float32 bytes in C order (not the .npy file)";
  m["generator"] = "kvtrim-lukv-profile";
  return m.dump(2) + "\n";
}

absl::Status WriteProfile(const std::string& npy_path, const lukv::ProfileBuilder& builder,
                          const NpyArray& profile,
                          const std::vector<std::string>& dump_paths) {
  KVTRIM_RETURN_IF_ERROR(WriteNpy(npy_path, profile));
  const std::string json_path = npy_path + ".json";
  std::ofstream out(json_path, std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(json_path, ": cannot open for writing"));
  out << ProfileManifestJson(builder, profile, dump_paths);
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(json_path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvtrim
