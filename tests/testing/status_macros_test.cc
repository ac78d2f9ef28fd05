// KVTRIM_RETURN_IF_ERROR and KVTRIM_ASSIGN_OR_RETURN (base/status_macros.h): they return the
// error, go on after OK and evaluate their expression exactly once.
#include "base/status_macros.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvtrim {
namespace {

using testing::IsOk;
using testing::StatusIs;

/// Counts its calls; fails when `fail`.
absl::Status Step(bool fail, int* calls) {
  ++*calls;
  return fail ? absl::InvalidArgumentError("step failed") : absl::OkStatus();
}

/// Two steps; the second runs only after the first succeeded.
absl::Status TwoSteps(bool fail_first, int* calls) {
  KVTRIM_RETURN_IF_ERROR(Step(fail_first, calls));
  KVTRIM_RETURN_IF_ERROR(Step(false, calls));
  return absl::OkStatus();
}

/// A move-only value, or NOT_FOUND.
absl::StatusOr<std::unique_ptr<std::string>> Lookup(bool found, int* calls) {
  ++*calls;
  if (!found) return absl::NotFoundError("no such name");
  return std::make_unique<std::string>("value");
}

/// The looked-up value's length, through both macro forms (a declaration and an lvalue).
absl::StatusOr<size_t> Length(bool found, int* calls) {
  KVTRIM_ASSIGN_OR_RETURN(std::unique_ptr<std::string> first, Lookup(found, calls));
  std::unique_ptr<std::string> second;
  KVTRIM_ASSIGN_OR_RETURN(second, Lookup(true, calls));
  return first->size() + second->size();
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtTheFirstError) {
  int calls = 0;
  EXPECT_THAT(TwoSteps(true, &calls), StatusIs(absl::StatusCode::kInvalidArgument, "step failed"));
  EXPECT_EQ(calls, 1);
  calls = 0;
  EXPECT_THAT(TwoSteps(false, &calls), IsOk());
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacrosTest, AssignOrReturnMovesTheValueOrReturnsTheError) {
  int calls = 0;
  absl::StatusOr<size_t> length = Length(true, &calls);
  ASSERT_THAT(length, IsOk());
  EXPECT_EQ(*length, 10u);
  EXPECT_EQ(calls, 2);
  calls = 0;
  EXPECT_THAT(Length(false, &calls), StatusIs(absl::StatusCode::kNotFound, "no such name"));
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace kvtrim
