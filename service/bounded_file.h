// Small configuration files (TLS PEM files, the bearer token table) read safely: regular
// files only, opened without blocking (a FIFO never stalls start-up), bounded in size.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace kvtrim::service {

/// The whole of `path`, given as --`flag`: FAILED_PRECONDITION naming the flag when it
/// cannot be opened or read or is not a regular file, INVALID_ARGUMENT when it has more
/// than `max_bytes` bytes.
absl::StatusOr<std::string> ReadBoundedFile(const char* flag, const std::string& path,
                                            size_t max_bytes);

}  // namespace kvtrim::service
