// kvtrim_make_corpus: writes the seed corpus of every fuzz target, fuzz/corpus/<target>/,
// from the real fixtures in samples/ (see fuzz/README.md). Run from the fuzz build:
//   build-fuzz/fuzz/kvtrim_make_corpus fuzz/corpus
// Seeds are small (layers of 16 tokens, the sample model cut to two layers and eight rows of
// W_O) so that the fuzzers run fast; the request targets name the full sample model, which
// their service registers at start-up.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/model_bundle.h"
#include "formats/safetensors.h"
#include "fuzz/corpus_requests.h"
#include "fuzz/limits.h"
#include "fuzz/records.h"
#include "fuzz/sample_model.h"
#include "formats/npy.h"
#include "kernels/registry.h"
#include "service/model_digest.h"
#include "service/model_file.h"

namespace kvtrim::fuzz {
namespace {

namespace fs = std::filesystem;

/// Reports `what` and exits 1.
[[noreturn]] void Die(const std::string& what) {
  std::cerr << "kvtrim_make_corpus: " << what << std::endl;
  std::exit(1);
}

/// The value of `value`, or Die naming `what`.
template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}

/// The bytes of the file at `path`.
std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

/// Writes `seeds` into `dir`/`target`/ (replacing that directory).
void WriteSeeds(const fs::path& dir, const std::string& target, const Seeds& seeds) {
  const fs::path out = dir / target;
  fs::remove_all(out);
  fs::create_directories(out);
  size_t total = 0;
  for (const auto& [name, bytes] : seeds) {
    std::ofstream(out / name, std::ios::binary) << bytes;
    total += bytes.size();
  }
  std::cout << target << ": " << seeds.size() << " seeds, " << total << " bytes" << std::endl;
}

/// Tokens [begin, begin + count) of every tensor [a, N, c] of a calibration dump.
SafetensorsTensor SliceTokens(const SafetensorsTensor& tensor, int64_t begin, int64_t count) {
  SafetensorsTensor out;
  out.dtype = tensor.dtype;
  out.shape = {tensor.shape[0], count, tensor.shape[2]};
  const size_t row = static_cast<size_t>(tensor.shape[2]) * DTypeSize(tensor.dtype);
  for (int64_t i = 0; i < tensor.shape[0]; ++i) {
    const size_t at = static_cast<size_t>(i * tensor.shape[1] + begin) * row;
    out.data.append(tensor.data, at, static_cast<size_t>(count) * row);
  }
  return out;
}

/// The sample model cut to its first `layers` layers and its first `hidden` rows of W_O
/// (hidden_size = `hidden`): the same kinds of tensors in a few KiB.
ModelBundle SmallBundle(const ModelBundle& full, int layers, int64_t hidden) {
  ModelBundle bundle;
  bundle.header = full.header;
  bundle.header.set_num_layers(layers);
  bundle.header.set_hidden_size(static_cast<int32_t>(hidden));
  for (int l = 0; l < layers; ++l) {
    for (const char* part : {".query_mean", ".query_cov"}) {
      const std::string name = absl::StrCat("layers.", l, part);
      bundle.weights[name] = full.weights.at(name);
    }
    const std::string name = absl::StrCat("layers.", l, ".w_o");  // [D, H_q * d]
    SafetensorsTensor w_o = full.weights.at(name);
    w_o.data.resize(static_cast<size_t>(hidden * w_o.shape[1]) * 4);
    w_o.shape[0] = hidden;
    bundle.weights[name] = w_o;
  }
  const SafetensorsTensor& profile = full.weights.at("profile.snapkv");  // [99, L, H_kv]
  SafetensorsTensor cut;
  cut.shape = {profile.shape[0], layers, profile.shape[2]};
  const size_t row = static_cast<size_t>(profile.shape[2]) * 4;
  for (int64_t k = 0; k < profile.shape[0]; ++k) {
    cut.data.append(profile.data, static_cast<size_t>(k * profile.shape[1]) * row, layers * row);
  }
  bundle.weights["profile.snapkv"] = cut;
  bundle.manifests = full.manifests;
  return bundle;
}

/// The bytes kvtrimd writes for the model `bundle` registers (WriteModelFile).
std::string ModelFileBytes(const ModelBundle& bundle, const fs::path& scratch) {
  ModelInput input = Check(AssembleModel(RegistrationStream(bundle, 1 << 20), kFuzzMaxModelBytes),
                           "assembling a model");
  Check(BuildModelFrom(input), "building a seed model");  // seeds are valid models
  const std::string path = (scratch / "seed.kvtmodel").string();
  absl::Status written = service::WriteModelFile(path, input, service::ComputeModelDigest(input));
  if (!written.ok()) Die(written.ToString());
  return ReadFile(path);
}

/// Records of a RegisterModel stream.
std::string StreamRecords(const ModelBundle& bundle, int64_t chunk_bytes) {
  std::string out;
  for (const auto& message : RegistrationStream(bundle, chunk_bytes)) {
    AppendRecord(message.SerializeAsString(), &out);
  }
  return out;
}

/// A calibration dump of layer 0 of samples/calib/stories260k_q0, tokens 188..221 (the last
/// 12 context tokens, the question and the answer).
SafetensorsFile SmallDump(const std::string& source_dir) {
  SafetensorsFile full = Check(ReadSafetensors(source_dir + "/samples/calib/stories260k_q0"
                                                            ".safetensors"),
                               "calibration dump");
  SafetensorsFile dump;
  for (const char* part : {"keys", "values", "queries"}) {
    const std::string name = absl::StrCat("layers.0.", part);
    dump.tensors[name] = SliceTokens(full.tensors.at(name), 188, 222 - 188);
  }
  dump.metadata = {{"context_length", "12"}, {"decode_start", "18"}};
  return dump;
}

/// Seeds of the safetensors target: layer inputs, a model bundle, a dump, odd tensors.
Seeds SafetensorsSeeds(const SafetensorsFile& prefill, const ModelBundle& small_model,
                       const SafetensorsFile& dump) {
  SafetensorsFile layers;
  for (const char* part : {"keys", "values"}) {
    const std::string name = absl::StrCat("layer.0.", part);
    layers.tensors[name] = SliceTokens(prefill.tensors.at(name), 0, 16);
  }
  layers.tensors["layer.0.queries"] = SliceTokens(prefill.tensors.at("layer.0.queries"), 28, 4);
  layers.metadata = {{"n", "16"}, {"w", "4"}};
  SafetensorsFile mixed;
  mixed.tensors["a"] = {DType::kBF16, {2, 1}, std::string(4, '\x3f')};
  mixed.tensors["b"] = {DType::kF16, {}, std::string(2, '\x3c')};
  mixed.tensors["c"] = {DType::kF32, {0, 3}, ""};
  return {{"layer_inputs", Check(SerializeSafetensors(layers), "layers")},
          {"model_bundle_2_layers",
           Check(SerializeSafetensors(ModelBundleToSafetensors(small_model)), "bundle")},
          {"calibration_dump", Check(SerializeSafetensors(dump), "dump")},
          {"dtypes_scalar_empty", Check(SerializeSafetensors(mixed), "mixed")},
          {"empty", Check(SerializeSafetensors(SafetensorsFile{}), "empty")}};
}

/// Seeds of the npy target: the sample profile, small arrays, a version 2.0 header.
Seeds NpySeeds(const std::string& source_dir) {
  Seeds seeds = {{"stories260k_lukv_snapkv",
                  ReadFile(source_dir + "/samples/stories260k_lukv_snapkv.npy")}};
  const std::vector<std::pair<std::string, NpyArray>> arrays = {
      {"scalar", {{}, {1.5f}}},
      {"vector", {{3}, {0.f, -1.f, 2.5f}}},
      {"matrix_empty_row", {{0, 4}, {}}},
      {"profile_shape", {{99, 1, 2}, std::vector<float>(198, 0.25f)}}};
  for (const auto& [name, array] : arrays) seeds[name] = Check(SerializeNpy(array), name);
  // Format version 2.0: a 4-byte header length.
  const std::string v1 = seeds["vector"];
  std::string v2 = v1.substr(0, 6) + std::string("\x02\x00", 2) + v1.substr(8, 2) +
                   std::string(2, '\0') + v1.substr(10);
  seeds["vector_v2"] = v2;
  return seeds;
}

/// Seeds of the lukv_profile target: mode byte 0 dump, 1 model bundle, 2 manifest.
Seeds LukvProfileSeeds(const ModelBundle& small_model, const SafetensorsFile& dump) {
  Seeds seeds;
  seeds["dump_1_layer"] = std::string(1, '\0') + Check(SerializeSafetensors(dump), "dump");
  seeds["model_2_layers"] = std::string(1, '\1') +
      Check(SerializeSafetensors(ModelBundleToSafetensors(small_model)), "bundle");
  seeds["manifest_full"] = "\2{\"metric\":\"snapkv\",\"sink\":4,\"window\":32}";
  seeds["manifest_empty_object"] = "\2{}";
  seeds["manifest_empty"] = "\2";
  return seeds;
}

/// Seeds of the rope_scaling target: each scaling type at two thetas, head_dim 128.
Seeds RopeScalingSeeds() {
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"none", ""},
      {"null", "null"},
      {"default", R"({"rope_type":"default"})"},
      {"linear", R"({"type":"linear","factor":2.0})"},
      {"llama3", R"({"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                 R"("original_max_position_embeddings":8192,"rope_type":"llama3"})"},
      {"yarn", R"({"rope_type":"yarn","factor":4.0})"}};
  Seeds seeds;
  for (const auto& [name, json] : texts) {
    for (double theta : {10000.0, 500000.0}) {
      std::string bytes(sizeof theta, '\0');
      std::memcpy(bytes.data(), &theta, sizeof theta);
      bytes.push_back(static_cast<char>(63));  // head_dim 128
      seeds[absl::StrCat(name, "_theta_", static_cast<int64_t>(theta))] = bytes + json;
    }
  }
  return seeds;
}

/// Writes every target's seeds under argv[1].
int Main(int argc, char** argv) {
  if (argc != 2) Die("usage: kvtrim_make_corpus OUT_DIR (fuzz/corpus)");
  const fs::path out = argv[1];
  const std::string source_dir = KVTRIM_SOURCE_DIR;
  const fs::path scratch = fs::temp_directory_path() / absl::StrCat("kvtrim-corpus-", getpid());
  fs::create_directories(scratch);

  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  const SafetensorsFile prefill =
      Check(ReadSafetensors(source_dir + "/samples/stories260k_prefill.safetensors"), "prefill");
  const ModelBundle model = Check(ReadModelBundle(SampleModelPath()), "sample model");
  const ModelInput model_input =
      Check(AssembleModel(RegistrationStream(model, 1 << 20), kFuzzMaxModelBytes), "model");
  const std::string digest = service::ComputeModelDigest(model_input);
  const ModelBundle small_model = SmallBundle(model, 2, 8);
  const SafetensorsFile dump = SmallDump(source_dir);

  WriteSeeds(out, "compress_request", CompressRequestSeeds(prefill, registry, digest));
  WriteSeeds(out, "session", SessionSeeds(prefill, registry, digest));
  WriteSeeds(out, "safetensors", SafetensorsSeeds(prefill, small_model, dump));
  WriteSeeds(out, "npy", NpySeeds(source_dir));
  const ModelBundle one_layer = SmallBundle(model, 1, 4);
  WriteSeeds(out, "model_file", {{"stories260k_2_layers", ModelFileBytes(small_model, scratch)},
                                 {"stories260k_1_layer", ModelFileBytes(one_layer, scratch)}});
  WriteSeeds(out, "register_model",
             {{"stories260k_2_layers_1k_chunks", StreamRecords(small_model, 1024)},
              {"stories260k_1_layer_whole", StreamRecords(one_layer, 1 << 20)}});
  WriteSeeds(out, "lukv_profile", LukvProfileSeeds(small_model, dump));
  WriteSeeds(out, "rope_scaling", RopeScalingSeeds());
  fs::remove_all(scratch);
  return 0;
}

}  // namespace
}  // namespace kvtrim::fuzz

int main(int argc, char** argv) { return kvtrim::fuzz::Main(argc, argv); }
