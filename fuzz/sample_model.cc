#include "fuzz/sample_model.h"

#include <algorithm>

#include "service/model_codec.h"

namespace kvtrim::fuzz {

std::string SampleModelPath() {
  return std::string(KVTRIM_SOURCE_DIR) + "/samples/stories260k_model.safetensors";
}

std::vector<v1::RegisterModelRequest> RegistrationStream(const ModelBundle& bundle,
                                                         int64_t chunk_bytes) {
  std::vector<v1::RegisterModelRequest> stream(1);
  *stream[0].mutable_header() = bundle.header;
  for (const auto& [name, tensor] : bundle.weights) {
    const int64_t size = static_cast<int64_t>(tensor.data.size());
    for (int64_t offset = 0; offset == 0 || offset < size; offset += chunk_bytes) {
      v1::ModelWeightChunk* chunk = stream.emplace_back().mutable_weight();
      chunk->set_name(name);
      chunk->set_offset_bytes(static_cast<uint64_t>(offset));
      const int64_t length = std::min(chunk_bytes, size - offset);
      chunk->set_data(tensor.data.substr(static_cast<size_t>(offset),
                                         static_cast<size_t>(length)));
      if (offset > 0) continue;
      chunk->set_dtype(ToProtoDType(tensor.dtype));
      for (int64_t extent : tensor.shape) chunk->add_shape(extent);
      if (auto it = bundle.manifests.find(name); it != bundle.manifests.end()) {
        chunk->set_manifest_json(it->second);
      }
    }
  }
  return stream;
}

absl::StatusOr<ModelInput> AssembleModel(const std::vector<v1::RegisterModelRequest>& stream,
                                         int64_t max_model_bytes) {
  service::ModelAssembler assembler(max_model_bytes);
  for (const v1::RegisterModelRequest& message : stream) {
    if (absl::Status added = assembler.Add(message); !added.ok()) return added;
  }
  return assembler.Finish();
}

absl::StatusOr<std::string> RegisterBundle(const std::string& path,
                                           service::ModelStore* store) {
  absl::StatusOr<ModelBundle> bundle = ReadModelBundle(path);
  if (!bundle.ok()) return bundle.status();
  absl::StatusOr<ModelInput> input = AssembleModel(RegistrationStream(*bundle, int64_t{1} << 20),
                                                   store->options().max_model_bytes);
  if (!input.ok()) return input.status();
  return store->Add(*std::move(input));
}

}  // namespace kvtrim::fuzz
