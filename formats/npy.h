// NumPy .npy files (format version 1.0) holding little-endian float32 ('<f4') arrays in
// C order: the LU-KV profile's storage format (lukv.md §5.2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtrim {

/// A dense row-major float32 array.
struct NpyArray {
  std::vector<int64_t> shape;  // e.g. [99, L, H_kv]; empty = scalar
  std::vector<float> data;     // product(shape) values

  /// product(shape) (1 for a scalar).
  int64_t NumElements() const;
};

/// The array's data as little-endian bytes (what the profile manifest's sha256 covers).
std::string NpyDataBytes(const NpyArray& array);

/// The bytes np.save writes for `array` (v1.0 header "{'descr': '<f4', 'fortran_order':
/// False, 'shape': (...), }" padded with spaces and '\n' to a multiple of 64 bytes, then the
/// data). INVALID_ARGUMENT when data.size() != product(shape) or a dimension is negative.
absl::StatusOr<std::string> SerializeNpy(const NpyArray& array);

/// Parses .npy bytes (versions 1.0 and 2.0). Only '<f4' in C order is accepted; errors are
/// INVALID_ARGUMENT starting with `source`.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view source);

/// Serialises and writes `array` to `path` (replacing it). INTERNAL on an I/O error.
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

/// Reads and parses `path`. NOT_FOUND when it cannot be opened.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace kvtrim
