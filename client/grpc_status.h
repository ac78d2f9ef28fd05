// Conversion of gRPC call statuses into absl::Status, the error type of the client API.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvtrim {

/// Turns a gRPC status into an absl::Status with the same code and message. This is the only
/// place the client converts statuses; gRPC codes and absl codes share their numbering
/// (0..16), and a code outside that range becomes UNKNOWN with the original number in the
/// message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvtrim
