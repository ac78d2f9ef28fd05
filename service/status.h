// The one place where internal absl::Status values become gRPC statuses.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace kvtrim::service {

/// Converts an internal status to the gRPC status sent to the client: same code (absl and
/// gRPC share the canonical code numbering), same message. This is the ONLY function that
/// builds a grpc::Status from an internal error (design convention 2).
grpc::Status ToGrpcStatus(const absl::Status& status);

/// The canonical upper-case name of a status code ("OK", "INVALID_ARGUMENT", ...), used as
/// the `code` label of kvtrim_requests_total.
std::string StatusCodeName(absl::StatusCode code);

}  // namespace kvtrim::service
