// RegisterModel stream -> ModelInput, and RegisteredModel -> ModelInfo (ListModels).
// Proto-level checks only (message order, names, dtypes, chunk offsets, sizes, manifests);
// shapes against the header, values and completeness are BuildModel's (kernels/model.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/model.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::service {

/// Longest model name accepted (header.name; a stored model file's name too): ListModels
/// answers every name, and a long one would push its answer past the clients' message limit.
inline constexpr size_t kMaxModelNameBytes = 256;

/// The fields of a profile manifest ({"metric": "snapkv", "sink": 4, "window": 32}).
struct ProfileManifest {
  std::string metric;  // the scorer the profile was built with ("" = the profile's name)
  int64_t sink = 0;    // protected first tokens it was built with, >= 0
  int64_t window = 0;  // protected last tokens it was built with, >= 0
};

/// Parses a manifest: a JSON object with optional keys metric (string), sink and window
/// (integers >= 0); "" means {}. Other keys are refused (a typo would otherwise be lost).
/// Errors: INVALID_ARGUMENT naming `field` ("weights[profile.x].manifest_json: ...").
absl::StatusOr<ProfileManifest> ParseProfileManifest(const std::string& json,
                                                     const std::string& field);

/// The canonical manifest text of `profile`: {"metric":"...","sink":S,"window":W}.
std::string CanonicalManifestJson(const ProfileInput& profile);

/// The kernel layout of a proto header (no checks: BuildModel validates it).
ModelLayout LayoutFromHeader(const v1::ModelHeader& header);

/// Assembles one RegisterModel stream. Rules, all INVALID_ARGUMENT naming the field unless
/// noted:
///   - the first message carries `header`, and only the first ("header: ...");
///   - a weight's first chunk (offset_bytes 0) carries its name, dtype and full shape (every
///     extent >= 1), and for "profile.{name}" its manifest_json; later chunks repeat the
///     name and may repeat dtype / shape / manifest, which must then match;
///   - chunks of one weight arrive in order and contiguously: each starts where the previous
///     one ended, so a duplicate, overlapping, out-of-order or gapped chunk, or one running
///     past the end, is refused naming "weights[NAME].offset_bytes";
///     chunks of different weights may interleave;
///   - names are "layers.{l}.w_o", "layers.{l}.query_mean", "layers.{l}.query_cov" or
///     "profile.{name}" ("weights[NAME].name");
///   - the declared sizes of all weights together stay within `max_model_bytes`
///     (RESOURCE_EXHAUSTED naming "--max_model_bytes"), checked before any allocation.
class ModelAssembler {
 public:
  /// `max_model_bytes` > 0: the largest registration accepted (sum of weight sizes).
  explicit ModelAssembler(int64_t max_model_bytes);

  /// Adds the next message of the stream.
  absl::Status Add(const v1::RegisterModelRequest& message);

  /// Ends the stream: the header must have come and every weight must be complete
  /// ("weights[NAME].data: received N of S bytes"). Moves the tensors out; call once.
  absl::StatusOr<ModelInput> Finish();

  /// Tensor bytes received so far (kvtrim_request_bytes_total).
  int64_t received_bytes() const { return received_bytes_; }

 private:
  /// One weight being received.
  struct Pending {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    std::string manifest_json;
    uint64_t size = 0;   // declared bytes: product(shape) * dtype size
    std::string bytes;   // reserved on the first chunk (no pages touched), appended to;
                         // its length is the next chunk's offset_bytes
  };

  absl::Status AddHeader(const v1::ModelHeader& header);
  absl::Status AddChunk(const v1::ModelWeightChunk& chunk);
  /// Validates a weight's first chunk and allocates its buffer.
  absl::Status StartWeight(const v1::ModelWeightChunk& chunk, const std::string& field,
                           Pending* pending);

  const int64_t max_model_bytes_;
  std::optional<v1::ModelHeader> header_;
  std::map<std::string, Pending> weights_;
  int64_t declared_bytes_ = 0;   // sum of the declared sizes of weights_
  int64_t received_bytes_ = 0;
  int64_t messages_ = 0;
};

/// ListModels entry of `model`: digest, header (as registered) and every weight name
/// ("layers.{l}.w_o", ..., "profile.{name}") in name order.
void EncodeModelInfo(const RegisteredModel& model, v1::ModelInfo* info);

}  // namespace kvtrim::service
