// Layer-relative errors: the field travels as a payload, and only a status that carries one
// is qualified with the layer's field, whatever its text.
#include "kernels/layer_error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvtrim {
namespace {

using testing::StatusIs;

TEST(LayerErrorTest, AFieldErrorIsQualifiedWithTheLayersField) {
  const absl::Status error = LayerFieldError("keys", "scorer 'snapkv' produced NaN");
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kInvalidArgument,
                              "keys: scorer 'snapkv' produced NaN"));
  const absl::Status qualified = QualifyLayerError(error, "layers[3]");
  EXPECT_THAT(qualified, StatusIs(absl::StatusCode::kInvalidArgument,
                                  "layers[3].keys: scorer 'snapkv' produced NaN"));
  EXPECT_FALSE(qualified.GetPayload(kLayerFieldPayload).has_value());
}

TEST(LayerErrorTest, TextAloneIsNeverRewritten) {
  // A message that merely starts with a tensor name carries no field.
  const absl::Status plain = absl::InvalidArgumentError("keys: something else");
  EXPECT_EQ(QualifyLayerError(plain, "layers[0]"), plain);
  const absl::Status other = absl::FailedPreconditionError("keys.shape[2]: d=512");
  EXPECT_EQ(QualifyLayerError(AsLayerFieldError(other, "keys"), "layers[0]"), other);
}

TEST(LayerErrorTest, AnExistingStatusGetsItsFieldOnlyWhenItNamesIt) {
  const absl::Status nan = absl::InvalidArgumentError("values: contains NaN at [0, 1, 2]");
  EXPECT_THAT(QualifyLayerError(AsLayerFieldError(nan, "values"), "session.layer"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "session.layer.values: contains NaN at [0, 1, 2]"));
  EXPECT_EQ(QualifyLayerError(AsLayerFieldError(nan, "keys"), "layers[0]"), nan);
  EXPECT_TRUE(AsLayerFieldError(absl::OkStatus(), "keys").ok());
}

}  // namespace
}  // namespace kvtrim
