#include "kernels/params.h"

#include <gtest/gtest.h>

namespace kvtrim {
namespace {

std::vector<ParamSpec> Specs() {
  return {ParamSpec::Int("window", 32, 1, 4096, "w"), ParamSpec::Float("eps", 1e-6, 0, 1, "e"),
          ParamSpec::Bool("flag", false, "f"),
          ParamSpec::Enum("pooling", "max", {"max", "avg"}, "p")};
}

TEST(Params, DefaultsThenOverrides) {
  auto r = ResolvedParams::Resolve(Specs(), {{"window", ParamValue::Number(8)},
                                             {"pooling", ParamValue::Text("avg")}},
                                   "settings.policy.params");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->Int("window"), 8);
  EXPECT_DOUBLE_EQ(r->Number("eps"), 1e-6);
  EXPECT_FALSE(r->Bool("flag"));
  EXPECT_EQ(r->Text("pooling"), "avg");
}

void ExpectError(const std::map<std::string, ParamValue>& overrides, const std::string& fragment) {
  auto r = ResolvedParams::Resolve(Specs(), overrides, "settings.policy.params");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status();
}

TEST(Params, RejectsBadValuesNamingTheField) {
  ExpectError({{"nope", ParamValue::Number(1)}}, "settings.policy.params.nope: unknown parameter");
  ExpectError({{"window", ParamValue::Number(0)}}, "settings.policy.params.window: 0 is out of range");
  ExpectError({{"window", ParamValue::Number(2.5)}}, "window: expects an integer");
  ExpectError({{"eps", ParamValue::Number(std::nan(""))}}, "eps: is NaN");
  ExpectError({{"flag", ParamValue::Number(2)}}, "flag: expects a boolean");
  ExpectError({{"pooling", ParamValue::Text("min")}}, "pooling: 'min' is not one of {max, avg}");
  ExpectError({{"pooling", ParamValue::Number(1)}}, "pooling: expects one of");
  ExpectError({{"window", ParamValue::Text("x")}}, "window: expects a number");
}

TEST(Params, AFlagIsTakenByBooleanParametersOnly) {
  auto r = ResolvedParams::Resolve(Specs(), {{"flag", ParamValue::Flag(true)}},
                                   "settings.policy.params");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->Bool("flag"));
  ExpectError({{"window", ParamValue::Flag(true)}},
              "settings.policy.params.window: expects an integer, got the flag true");
  ExpectError({{"eps", ParamValue::Flag(false)}},
              "settings.policy.params.eps: expects a number, got the flag false");
  ExpectError({{"pooling", ParamValue::Flag(true)}},
              "pooling: expects one of {max, avg}, got a flag");
}

}  // namespace
}  // namespace kvtrim
