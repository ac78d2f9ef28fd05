// Fuzz target: the safetensors reader (formats/safetensors.h), which reads the CLI's input
// files, model bundles, calibration dumps and kvtrimd's own model files. The input is a
// file's bytes. A file the parser accepts must serialise, and its serialisation must parse
// back to the same tensors and metadata; it then goes through the CLI's two readers of
// parsed files: layer inputs (layer.{i}.keys ...) and model bundles (back to safetensors).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "client/layer_inputs.h"
#include "client/model_bundle.h"
#include "formats/safetensors.h"

namespace kvtrim::fuzz {
namespace {

/// A broken round trip: report it and abort (libFuzzer keeps the input).
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "kvtrim fuzz: safetensors: %s\n", what);
  std::abort();
}

/// True when both files hold the same tensors (dtype, shape, bytes) and metadata.
bool SameFile(const SafetensorsFile& a, const SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, tensor] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.dtype != tensor.dtype ||
        it->second.shape != tensor.shape || it->second.data != tensor.data) {
      return false;
    }
  }
  return true;
}

/// Serialises `file` and parses it back; aborts unless the result is `file`.
void CheckRoundTrip(const SafetensorsFile& file) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(file);
  if (!bytes.ok()) return;  // e.g. a tensor named "" (kept by the reader, refused here)
  absl::StatusOr<SafetensorsFile> again = ParseSafetensors(*bytes, "round trip");
  if (!again.ok()) Fail("a serialised file does not parse");
  if (!SameFile(file, *again)) Fail("a serialised file parses to other contents");
}

}  // namespace
}  // namespace kvtrim::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtrim;
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!file.ok()) return 0;
  fuzz::CheckRoundTrip(*file);
  LayerInputsFromSafetensors(*file).IgnoreError();
  absl::StatusOr<ModelBundle> bundle = ModelBundleFromSafetensors(*file, "fuzz");
  if (bundle.ok()) fuzz::CheckRoundTrip(ModelBundleToSafetensors(*bundle));
  return 0;
}
