// GoogleTest matchers of absl::Status and absl::StatusOr<T>:
//
//   EXPECT_THAT(registry.Resolve(settings, "layers[0]"),
//               StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.name")));
//   EXPECT_THAT(ReadNpy(path), IsOk());
//
// A mismatch prints the actual code and message. The code is always checked; the message
// through any string matcher (HasSubstr, StartsWith, Eq, _).
#pragma once

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace kvtrim::testing {
namespace internal_status {

/// The status of a Status or of a StatusOr.
inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

/// Matches a Status / StatusOr whose code is `code` and whose message matches `message`.
class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code, ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  /// True on a match; explains the actual code and message otherwise.
  template <typename StatusType>
  bool MatchAndExplain(const StatusType& value, ::testing::MatchResultListener* listener) const {
    const absl::Status& status = StatusOf(value);
    const std::string message(status.message());
    if (status.code() != code_) {
      *listener << "whose code is " << absl::StatusCodeToString(status.code())
                << " and message \"" << message << "\"";
      return false;
    }
    ::testing::StringMatchResultListener inner;
    if (!message_.MatchAndExplain(message, &inner)) {
      *listener << "whose message \"" << message << "\" does not match";
      if (!inner.str().empty()) *listener << " (" << inner.str() << ")";
      return false;
    }
    return true;
  }

  /// "has code X and a message that ...".
  void DescribeTo(std::ostream* os) const {
    *os << "has code " << absl::StatusCodeToString(code_) << " and a message that ";
    message_.DescribeTo(os);
  }

  /// "does not have code X or has a message that ...".
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not have code " << absl::StatusCodeToString(code_)
        << " or has a message that ";
    message_.DescribeNegationTo(os);
  }

 private:
  absl::StatusCode code_;
  ::testing::Matcher<const std::string&> message_;
};

}  // namespace internal_status

/// Matches an absl::Status or absl::StatusOr<T> with code `code` and a message matching
/// `message` (a string matcher, or a string for equality).
template <typename MessageMatcher>
::testing::PolymorphicMatcher<internal_status::StatusIsMatcher> StatusIs(
    absl::StatusCode code, MessageMatcher&& message) {
  return ::testing::MakePolymorphicMatcher(internal_status::StatusIsMatcher(
      code,
      ::testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message))));
}

/// Matches an absl::Status or absl::StatusOr<T> with code `code`, whatever its message.
inline ::testing::PolymorphicMatcher<internal_status::StatusIsMatcher> StatusIs(
    absl::StatusCode code) {
  return StatusIs(code, ::testing::_);
}

/// Matches an OK absl::Status or absl::StatusOr<T>.
inline ::testing::PolymorphicMatcher<internal_status::StatusIsMatcher> IsOk() {
  return StatusIs(absl::StatusCode::kOk);
}

}  // namespace kvtrim::testing
