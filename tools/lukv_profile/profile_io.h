// File I/O of kvtrim-lukv-profile (LU-KV offline profiling, lukv.md §5.2): calibration dumps
// and the model bundle's W_O read with the safetensors reader, and the profile written as
// .npy plus its JSON manifest.
//
// Calibration dump (one safetensors file per calibration question):
//   layers.{l}.keys     [H_kv, N, d]  post-RoPE keys of the whole sequence
//   layers.{l}.values   [H_kv, N, d]
//   layers.{l}.queries  [H_q, N, d]   post-RoPE queries of every position
//   __metadata__ {"context_length": "T", "decode_start": "S"[, "softmax_scale": "x"]}
// Positions 0..T-1 are the context, T..S-1 the question (not used by the oracle), S..N-1
// the answer tokens whose queries are the decode steps.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/lukv/calibration.h"
#include "formats/npy.h"
#include "kernels/lukv/profile_builder.h"

namespace kvtrim {

/// Reads one calibration dump (F32, F16 or BF16 tensors; F32 ones are aliased). Errors:
/// NOT_FOUND for an unreadable file, INVALID_ARGUMENT naming the file and the tensor or
/// metadata key that is missing or malformed.
absl::StatusOr<lukv::CalibrationDump> ReadCalibrationDump(const std::string& path);

/// Reads the layout metadata (name, num_layers, num_query_heads, num_kv_heads, head_dim,
/// hidden_size) and every layers.{l}.w_o [D, H_q*d] of a model bundle; other tensors
/// (query statistics, profiles) are ignored.
absl::StatusOr<lukv::ModelWeights> ReadModelWeights(const std::string& path);

/// Lower-case hex SHA-256 of `bytes` (OpenSSL EVP).
std::string Sha256Hex(absl::string_view bytes);

/// The JSON manifest of a finished profile (pretty-printed): model, num_layers,
/// num_kv_heads, metric and its resolved parameters, sink, window, grid, calib_T, M,
/// min_retention, oracle_norm, gqa_agg, layer_norm, k_max, shape, dtype, dumps and the
/// sha256 of the array's little-endian float32 bytes.
std::string ProfileManifestJson(const lukv::ProfileBuilder& builder, const NpyArray& profile,
                                const std::vector<std::string>& dump_paths);

/// Writes `profile` to `npy_path` and its manifest to `npy_path` + ".json".
absl::Status WriteProfile(const std::string& npy_path, const lukv::ProfileBuilder& builder,
                          const NpyArray& profile,
                          const std::vector<std::string>& dump_paths);

}  // namespace kvtrim
