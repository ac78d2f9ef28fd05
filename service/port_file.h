// The --port_file readiness file: where a kvtrimd that bound port 0 tells scripts and tests
// which addresses it got, written only once it is SERVING.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace kvtrim::service {

/// What a port file says. Its text is two "key=value" lines:
///   grpc=127.0.0.1:41234        (the address clients dial, or unix:PATH)
///   metrics=127.0.0.1:39111     (the /metrics exporter's host:port; empty when disabled)
struct PortFileContents {
  std::string grpc_address;
  std::string metrics_address;
};

/// The text of `contents` as written to the file.
std::string FormatPortFile(const PortFileContents& contents);

/// Writes `contents` to `path` atomically: into a temporary file beside it, then rename(2),
/// so a reader that sees the file sees all of it. Errors are UNAVAILABLE naming
/// "--port_file" and the path.
absl::Status WritePortFile(const std::string& path, const PortFileContents& contents);

/// Removes `path` (called when the server stops serving); a missing file is not an error.
void RemovePortFile(const std::string& path);

}  // namespace kvtrim::service
