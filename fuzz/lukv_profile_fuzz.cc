// Fuzz target: the LU-KV profile inputs. The input's first byte picks the parser, the rest
// is its input:
//   0  a calibration dump (safetensors, layers.{l}.keys/values/queries + metadata), read by
//      kvtrim-lukv-profile (tools/lukv_profile/profile_io.h ReadCalibrationDump) from an
//      in-memory file
//   1  a model bundle's W_O and layout for profiling (ReadModelWeights), likewise
//   2  a profile manifest ({"metric": ..., "sink": ..., "window": ...}), as RegisterModel
//      and kvtrimd's model files carry it (service/model_codec.h ParseProfileManifest)
// An accepted dump or model is checked against itself (Validate) as the profile builder
// checks them before use.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/lukv_profile/profile_io.h"
#include "fuzz/memory_file.h"
#include "service/model_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtrim;
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 3;
  ++data;
  --size;
  if (mode == 2) {
    const std::string json(reinterpret_cast<const char*>(data), size);
    service::ParseProfileManifest(json, "weights[profile.fuzz].manifest_json").IgnoreError();
    return 0;
  }
  static fuzz::MemoryFile* const file = new fuzz::MemoryFile();
  file->Write(data, size);
  if (mode == 0) {
    absl::StatusOr<lukv::CalibrationDump> dump = ReadCalibrationDump(file->Path());
    if (dump.ok() && !dump->Validate().ok()) std::abort();
  } else {
    absl::StatusOr<lukv::ModelWeights> model = ReadModelWeights(file->Path());
    if (model.ok() && !model->Validate().ok()) std::abort();
  }
  return 0;
}
