// Fuzz target: a RegisterModel stream (service/model_codec.h). The input is a stream of
// RegisterModelRequest wire messages (fuzz/records.h), parsed and assembled as kvtrimd's
// RegisterModel call does (ModelAssembler, --max_model_bytes lowered to 4 MiB), then built
// (BuildModelFrom) and digested as ModelStore::Add does. A model that builds is persisted
// (WriteModelFile, into this process's temporary directory) and must read back
// (ReadModelFile) to the same digest and build again: what a restart of kvtrimd relies on.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/limits.h"
#include "fuzz/records.h"
#include "fuzz/temp_dir.h"
#include "service/model_codec.h"
#include "service/model_digest.h"
#include "service/model_file.h"

namespace kvtrim::fuzz {
namespace {

/// Most messages of one input.
constexpr size_t kMaxMessages = 64;

/// A broken persistence property: report it and abort (libFuzzer keeps the input).
[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kvtrim fuzz: register model: %s\n", what.c_str());
  std::abort();
}

/// Persists `input` and reads it back as kvtrimd's next start would.
void CheckPersisted(const ModelInput& input, const std::string& digest) {
  const std::string path = ProcessTempDir() + "/model" + service::kModelFileSuffix;
  if (absl::Status written = service::WriteModelFile(path, input, digest); !written.ok()) {
    Fail("WriteModelFile: " + written.ToString());
  }
  absl::StatusOr<service::ModelFileContents> read =
      service::ReadModelFile(path, kFuzzMaxModelBytes + (int64_t{16} << 20));
  if (!read.ok()) Fail("a written model file does not read back: " + read.status().ToString());
  if (read->stored_digest != digest) Fail("the stored digest differs");
  if (service::ComputeModelDigest(read->input) != digest) {
    Fail("the model read back hashes to another digest");
  }
  if (!BuildModel(std::move(read->input)).ok()) Fail("the model read back does not build");
}

}  // namespace
}  // namespace kvtrim::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtrim;
  service::ModelAssembler assembler(fuzz::kFuzzMaxModelBytes);
  for (absl::string_view record : fuzz::SplitRecords(data, size, fuzz::kMaxMessages)) {
    v1::RegisterModelRequest message;
    // gRPC refuses an undecodable message before the call sees it: the stream ends.
    if (!message.ParseFromArray(record.data(), static_cast<int>(record.size()))) return 0;
    if (!assembler.Add(message).ok()) return 0;
  }
  absl::StatusOr<ModelInput> input = assembler.Finish();
  if (!input.ok()) return 0;
  absl::StatusOr<std::shared_ptr<RegisteredModel>> model = BuildModelFrom(*input);
  if (!model.ok()) return 0;
  const std::string digest = service::ComputeModelDigest(*input);
  (*model)->digest = digest;
  (*model)->input = *input;
  v1::ModelInfo info;
  service::EncodeModelInfo(**model, &info);
  fuzz::CheckPersisted(*input, digest);
  return 0;
}
