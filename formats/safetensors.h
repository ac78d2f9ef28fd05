// Reading and writing the safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON header, then the tensor bytes.
// Only the dtypes kvtrim transports are supported: F32, F16, BF16.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/dtype.h"

namespace kvtrim {

/// The header spelling of `dtype` (the subset of safetensors dtypes kvtrim accepts): "F32",
/// "F16" or "BF16".
const char* SafetensorsDTypeName(DType dtype);

/// One tensor: dtype, shape and its dense row-major little-endian bytes.
struct SafetensorsTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // e.g. [H_kv, n, d]; empty = scalar
  std::string data;            // product(shape) * DTypeSize(dtype) bytes

  /// product(shape) (1 for a scalar).
  int64_t NumElements() const;
};

/// A whole file: tensors by name and the optional string-to-string `__metadata__`.
struct SafetensorsFile {
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Parses a file's bytes. Validates the header length (8 bytes, within the file, at most
/// 100 MB), the JSON header, every entry's dtype, shape and data_offsets (ordered, inside the
/// data section, size == product(shape) * dtype size, no overlap), and the metadata (strings).
/// Errors are INVALID_ARGUMENT starting with `source` and naming the offending tensor.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view source);

/// Reads and parses the file at `path`. NOT_FOUND when it cannot be opened.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

/// Serialises `file`: tensors in name order, consecutive offsets, header padded with spaces
/// to a multiple of 8 bytes. INVALID_ARGUMENT naming the tensor when its data size does not
/// match its shape, or when a name is empty or "__metadata__".
absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file);

/// Serialises `file` and writes it to `path` (replacing it). INTERNAL on an I/O error.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

}  // namespace kvtrim
