// Client strings are echoed bounded (a quoted prefix plus the length) and numbers exactly:
// a status message stays far below gRPC's trailer limit, so the caller sees the field.
#include <cmath>
#include <limits>
#include <string>

#include "kernels/client_text.h"
#include "kernels/engine.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;

/// Longest message these tests accept (a 16 KiB echo would reach gRPC's trailer limit).
constexpr size_t kMessageBound = 2048;

class BoundedMessagesTest : public SharedServerTest {
 protected:
  /// The Compress status of `request`, checked to carry a bounded message.
  grpc::Status Call(const v1::CompressRequest& request) {
    grpc::Status status = CallCompress(*stub_, request);
    EXPECT_LT(status.error_message().size(), kMessageBound) << status.error_message();
    return status;
  }
};

const std::string kLong(20000, 'x');
const std::string kPrefix(kQuotedPrefixBytes, 'x');  // what a message quotes of kLong

TEST_F(BoundedMessagesTest, UnknownPolicyNameIsAPrefixAndItsLength) {
  auto r = MakeRequest("snapkv");
  r.mutable_settings()->mutable_policy()->set_name(kLong);
  const grpc::Status s = Call(r);
  EXPECT_GRPC_ERROR(s, StatusCode::INVALID_ARGUMENT,
                    "settings.policy.name: unknown policy '" + kPrefix +
                        "...' (20000 bytes); known policies: ");
}

TEST_F(BoundedMessagesTest, UnknownParameterNameIsBoundedInTheField) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())[kLong].set_number(1);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params." + kPrefix +
                        "...(20000 bytes): unknown parameter");
}

TEST_F(BoundedMessagesTest, EnumTextIsBounded) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["pooling"].set_text(kLong);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.pooling: '" + kPrefix +
                        "...' (20000 bytes) is not one of {max, avg}");
}

TEST_F(BoundedMessagesTest, ControlBytesAreEscaped) {
  auto r = MakeRequest("snapkv");
  r.mutable_settings()->mutable_policy()->set_name("bad\nname\x01");
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "unknown policy 'bad\\nname\\x01'");
}

TEST_F(BoundedMessagesTest, AFlagIsNotAnInteger) {
  auto r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["window"].set_flag(true);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.window: expects an integer, got the flag true");
}

TEST_F(BoundedMessagesTest, NumbersPrintExactly) {
  auto r = MakeRequest("snapkv");
  r.mutable_settings()->mutable_budget()->set_keep_fraction(std::nextafter(1.0, 2.0));
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.budget.keep_fraction: must be in (0, 1], got 1.0000000000000002");
  r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["window"].set_number(1234567);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.window: 1234567 is out of range [1, 4096]");
  r = MakeRequest("snapkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["window"].set_number(2.5);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.policy.params.window: expects an integer, got 2.5");
}

TEST_F(BoundedMessagesTest, LayerIdsAndNumLayersAreBounded) {
  auto r = MakeRequest("snapkv");
  r.mutable_layers(0)->set_layer_id(std::numeric_limits<int32_t>::max());
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "layers[0].layer_id: must be in [0, 1048575], got 2147483647");
  r = MakeRequest("snapkv");
  r.mutable_settings()->set_num_layers(kMaxLayers + 1);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::INVALID_ARGUMENT,
                    "settings.num_layers: must be in [0, 1048576] (0 = unknown), got 1048577");
}

TEST_F(BoundedMessagesTest, UnknownModelDigestIsBounded) {
  auto r = MakeRequest("criticalkv");
  r.mutable_settings()->set_model_digest(kLong);
  EXPECT_GRPC_ERROR(Call(r), StatusCode::FAILED_PRECONDITION,
                    "settings.model_digest: unknown model digest '" + kPrefix +
                        "...' (20000 bytes)");
}

}  // namespace
}  // namespace kvtrim::service::testing
