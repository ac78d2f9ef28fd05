// StatusIs / IsOk: they match what they should, refuse what they should not, and say why.
#include "tests/testing/status_matchers.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtrim::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

/// The explanation a matcher gives for `value` (empty on a match).
template <typename Matcher, typename Value>
std::string Explain(const Matcher& matcher, const Value& value) {
  ::testing::StringMatchResultListener listener;
  ::testing::ExplainMatchResult(matcher, value, &listener);
  return listener.str();
}

TEST(StatusIsTest, MatchesCodeAndMessage) {
  const absl::Status bad = absl::InvalidArgumentError("layers[3].keys.shape[1]: too long");
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keys.shape")));
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bad, Not(StatusIs(absl::StatusCode::kNotFound, HasSubstr("keys.shape"))));
  EXPECT_THAT(bad, Not(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("values"))));
  EXPECT_THAT(bad, Not(IsOk()));
  EXPECT_THAT(absl::OkStatus(), IsOk());
}

TEST(StatusIsTest, MatchesStatusOr) {
  const absl::StatusOr<int> value = 7;
  const absl::StatusOr<int> missing = absl::NotFoundError("model sha256:abc");
  EXPECT_THAT(value, IsOk());
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kNotFound, "model sha256:abc"));
  EXPECT_THAT(missing, Not(IsOk()));
}

TEST(StatusIsTest, ExplainsAMismatch) {
  const absl::Status bad = absl::InvalidArgumentError("policy.name: unknown");
  EXPECT_THAT(Explain(StatusIs(absl::StatusCode::kNotFound), bad),
              HasSubstr("whose code is INVALID_ARGUMENT and message \"policy.name: unknown\""));
  EXPECT_THAT(Explain(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget")), bad),
              HasSubstr("whose message \"policy.name: unknown\" does not match"));
  EXPECT_EQ(::testing::DescribeMatcher<absl::Status>(
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budget"))),
            "has code INVALID_ARGUMENT and a message that has substring \"budget\"");
}

}  // namespace
}  // namespace kvtrim::testing
