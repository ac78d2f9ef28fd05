// Tests of the load generator's flag parsing, validation and policy needs.
#include "client/loadgen/config.h"

#include <gtest/gtest.h>

namespace kvtrim::loadgen {
namespace {

TEST(LoadgenConfigTest, ParsesTransportsAndDtypes) {
  EXPECT_EQ(*ParseTransport("inline"), Transport::kInline);
  EXPECT_EQ(*ParseTransport("host_shm"), Transport::kHostShm);
  EXPECT_EQ(*ParseTransport("cuda_ipc"), Transport::kCudaIpc);
  EXPECT_NE(ParseTransport("tcp").status().message().find("--transport"), absl::string_view::npos);
  EXPECT_EQ(*ParseDType("bf16"), v1::DTYPE_BF16);
  EXPECT_EQ(*ParseDType("f32"), v1::DTYPE_F32);
  EXPECT_EQ(ParseDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_F16), 2);
  EXPECT_EQ(DTypeBytes(v1::DTYPE_F32), 4);
}

TEST(LoadgenConfigTest, DefaultsAreValidAndBadFieldsNameTheirFlag) {
  EXPECT_TRUE(ValidateConfig(LoadgenConfig()).ok());
  struct Case {
    void (*mutate)(LoadgenConfig&);
    const char* flag;
  };
  const Case cases[] = {
      {[](LoadgenConfig& c) { c.keep_fraction = 0; }, "--keep_fraction"},
      {[](LoadgenConfig& c) { c.q_heads = 12; }, "--q_heads"},
      {[](LoadgenConfig& c) { c.window = 40000; }, "--window"},
      {[](LoadgenConfig& c) { c.workers = 0; }, "--workers"},
      {[](LoadgenConfig& c) { c.chunk_bytes = 64 << 20; }, "--chunk_bytes"},
      {[](LoadgenConfig& c) { c.layers = 0; }, "--layers"},
  };
  for (const Case& test : cases) {
    LoadgenConfig config;
    test.mutate(config);
    absl::Status status = ValidateConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << test.flag;
    EXPECT_NE(status.message().find(test.flag), absl::string_view::npos) << status;
  }
}

TEST(PolicyNeedsTest, ValuesAndQueriesOnlyWhenListed) {
  v1::ListPoliciesResponse policies;
  v1::PolicyInfo* keys_only = policies.add_policies();
  keys_only->set_name("dropkv");
  keys_only->add_inputs(v1::POLICY_INPUT_KEYS);
  keys_only->set_scope(v1::DECISION_SCOPE_HEAD);
  v1::PolicyInfo* attention = policies.add_policies();
  attention->set_name("snapkv");
  attention->add_inputs(v1::POLICY_INPUT_KEYS);
  attention->add_inputs(v1::POLICY_INPUT_QUERIES);
  attention->add_optional_inputs(v1::POLICY_INPUT_VALUES);
  v1::PolicyInfo* model = policies.add_policies();
  model->set_name("laprox");
  model->add_inputs(v1::POLICY_INPUT_MODEL);
  model->set_scope(v1::DECISION_SCOPE_MODEL);

  absl::StatusOr<PolicyNeeds> needs = NeedsOfPolicy(policies, "dropkv");
  ASSERT_TRUE(needs.ok()) << needs.status();
  EXPECT_FALSE(needs->values);
  EXPECT_FALSE(needs->queries);
  EXPECT_FALSE(needs->model_wide);
  needs = NeedsOfPolicy(policies, "snapkv");
  ASSERT_TRUE(needs.ok()) << needs.status();
  EXPECT_FALSE(needs->values);  // optional: not sent unless asked
  EXPECT_TRUE(needs->queries);
  needs = NeedsOfPolicy(policies, "snapkv", /*include_optional=*/true);
  ASSERT_TRUE(needs.ok()) << needs.status();
  EXPECT_TRUE(needs->values);
  EXPECT_EQ(NeedsOfPolicy(policies, "laprox").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(NeedsOfPolicy(policies, "laprox", false, /*model_given=*/true).ok());
  EXPECT_EQ(NeedsOfPolicy(policies, "nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtrim::loadgen
