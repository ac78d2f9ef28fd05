#include "service/status.h"

namespace kvtrim::service {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::string StatusCodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace kvtrim::service
