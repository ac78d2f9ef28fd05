// Fuzz target: the .npy reader of LU-KV profiles (formats/npy.h). The input is a file's
// bytes. An array the parser accepts must serialise (np.save's layout) and parse back to the
// same shape and the same float bits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "formats/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvtrim::NpyArray;
  absl::StatusOr<NpyArray> array = kvtrim::ParseNpy(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  if (!array.ok()) return 0;
  absl::StatusOr<std::string> bytes = kvtrim::SerializeNpy(*array);
  if (!bytes.ok()) {
    std::fprintf(stderr, "kvtrim fuzz: npy: a parsed array does not serialise: %s\n",
                 bytes.status().ToString().c_str());
    std::abort();
  }
  absl::StatusOr<NpyArray> again = kvtrim::ParseNpy(*bytes, "round trip");
  if (!again.ok() || again->shape != array->shape ||
      kvtrim::NpyDataBytes(*again) != kvtrim::NpyDataBytes(*array)) {
    std::fprintf(stderr, "kvtrim fuzz: npy: a serialised array does not parse back\n");
    std::abort();
  }
  return 0;
}
