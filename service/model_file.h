// kvtrimd's on-disk model file (`<hex>.kvtmodel`): a safetensors file holding every tensor
// of a registration under its registration name ("layers.{l}.w_o", "profile.{name}", ...)
// and, in __metadata__, the header fields, the RoPE scaling JSON, each profile's manifest
// and the digest. The same keys as a client model bundle (client/model_bundle.h), so a
// persisted file can be registered again with `kvtrim register-model --model FILE`.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/model.h"

namespace kvtrim::service {

/// Value of the "format" metadata key of every model file.
inline constexpr char kModelFileFormat[] = "kvtrim-model/1";
/// File name suffix of a model file.
inline constexpr char kModelFileSuffix[] = ".kvtmodel";

/// Writes `input` with its `digest` to `path` atomically: the bytes go to `path` + ".tmp",
/// which is fsync'ed, renamed over `path`, and the directory is fsync'ed; on any error the
/// temporary file is removed. INTERNAL (RESOURCE_EXHAUSTED when the disk is full) naming
/// the path and the OS error.
absl::Status WriteModelFile(const std::string& path, const ModelInput& input,
                            const std::string& digest);

/// A model file as read back: the registration and the digest it claims.
struct ModelFileContents {
  ModelInput input;
  std::string stored_digest;  // the "digest" metadata value
};

/// Reads and parses the model file at `path` (safetensors framing, format key, header
/// fields, manifests). Does not check the digest (the store recomputes it). DATA_LOSS
/// describing what is wrong for a corrupt or truncated file; NOT_FOUND / INTERNAL when it
/// cannot be read; RESOURCE_EXHAUSTED for a file above `max_file_bytes` (or one this process
/// cannot hold); DATA_LOSS for anything but a regular file (opened without blocking: a FIFO
/// in the data directory cannot stall start-up).
absl::StatusOr<ModelFileContents> ReadModelFile(const std::string& path,
                                                int64_t max_file_bytes);

}  // namespace kvtrim::service
