// Fuzz target: kvtrimd's model files (`<hex>.kvtmodel`, service/model_file.h), which it
// reads at start-up from --data_dir. The input is a file's bytes, read from an in-memory
// file by ReadModelFile; an accepted file is then loaded as ModelStore::LoadFile loads it:
// its content digest computed and the model built (BuildModel: layout, RoPE scaling JSON,
// W_O, query statistics and LU-KV profiles checked, Gram matrices derived) and listed
// (EncodeModelInfo). The stored digest is not compared: the fuzzer cannot forge SHA-256.
#include <cstdint>
#include <memory>

#include "fuzz/memory_file.h"
#include "service/model_codec.h"
#include "service/model_digest.h"
#include "service/model_file.h"

namespace {

/// kvtrimd reads files of up to --max_model_bytes plus 16 MiB of header; here 8 MiB.
constexpr int64_t kMaxFileBytes = int64_t{8} << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtrim;
  if (size > static_cast<size_t>(kMaxFileBytes)) return -1;
  static fuzz::MemoryFile* const file = new fuzz::MemoryFile();
  file->Write(data, size);
  absl::StatusOr<service::ModelFileContents> contents =
      service::ReadModelFile(file->Path(), kMaxFileBytes);
  if (!contents.ok()) return 0;
  const std::string digest = service::ComputeModelDigest(contents->input);
  absl::StatusOr<std::shared_ptr<RegisteredModel>> model =
      BuildModel(std::move(contents->input));
  if (!model.ok()) return 0;
  (*model)->digest = digest;
  v1::ModelInfo info;
  service::EncodeModelInfo(**model, &info);
  return 0;
}
