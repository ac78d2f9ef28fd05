// Tests of the grpc::Status -> absl::Status conversion: every code and the message survive.
#include "client/grpc_status.h"

#include <gtest/gtest.h>

namespace kvtrim {
namespace {

TEST(GrpcStatusTest, OkIsOk) { EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok()); }

TEST(GrpcStatusTest, KeepsEveryCodeAndTheMessage) {
  for (int code = 1; code <= 16; ++code) {
    grpc::Status status(static_cast<grpc::StatusCode>(code), "layers[0].keys.shape: bad");
    absl::Status converted = FromGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(converted.code()), code);
    EXPECT_EQ(converted.message(), "layers[0].keys.shape: bad");
  }
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "x")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "x")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GrpcStatusTest, UnknownCodeBecomesUnknownAndNamesTheCode) {
  // 20 is no gRPC code but lies in grpc::StatusCode's range (-32..31: its enumerators run
  // from -1 to 16); a value outside it, such as 42, is undefined behaviour to hold in the
  // enum at all (UBSan: scripts/sanitize.sh).
  absl::Status converted = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "m"));
  EXPECT_EQ(converted.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(converted.message(), "gRPC status code 20: m");
}

}  // namespace
}  // namespace kvtrim
