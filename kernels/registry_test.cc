// The registry's composability rule and output shapes, and how Resolve applies them.
#include "kernels/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace kvtrim {
namespace {

using testing::IsOk;
using testing::StatusIs;

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { RegisterBuiltinPolicies(&registry_); }

  absl::StatusOr<ResolvedPolicy> Resolve(const std::string& name,
                                         OutputShape shape = OutputShape::kPerHead) const {
    CompressionSettings settings;
    settings.policy = name;
    settings.output_shape = shape;
    return registry_.Resolve(settings, "begin");
  }

  PolicyRegistry registry_;
};

TEST_F(RegistryTest, LaproxComposesWithTheUniformAllocatorOnly) {
  int refused = 0;
  for (const ScorerSpec* scorer : registry_.scorers()) {
    for (const AllocatorSpec* allocator : registry_.allocators()) {
      const absl::Status st = PolicyRegistry::CheckComposable(*scorer, *allocator);
      const bool laprox_other = scorer->kind == ScorerKind::kLaProx &&
                                allocator->kind != AllocatorKind::kUniform;
      EXPECT_EQ(st.ok(), !laprox_other) << scorer->name << "+" << allocator->name;
      if (st.ok()) continue;
      ++refused;
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(st.message(),
                "laprox allocates by its own top-K (policy.params.mode) and composes with the "
                "uniform allocator only, not '" + allocator->name + "'");
    }
  }
  EXPECT_EQ(refused, 3);  // pyramid, adakv, lukv
}

TEST_F(RegistryTest, EveryPresetIsComposable) {
  for (const PolicyPreset& preset : registry_.presets()) {
    EXPECT_TRUE(Resolve(preset.name).ok()) << preset.name;
  }
}

TEST_F(RegistryTest, ResolveRefusesACompositionThatCannotRunNamingThePolicyField) {
  EXPECT_THAT(Resolve("laprox+pyramid"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "begin.policy.name: policy 'laprox+pyramid' cannot be served: laprox "
                       "allocates by its own top-K (policy.params.mode) and composes with the "
                       "uniform allocator only, not 'pyramid'"));
  EXPECT_THAT(Resolve("laprox+uniform"), IsOk());
}

TEST_F(RegistryTest, OnlyPositionAndHashScorersSkipTheKeyValues) {
  // The backends read the keys' values only for the scorers whose description says so.
  for (const ScorerSpec* scorer : registry_.scorers()) {
    const bool position_or_hash = scorer->name == "streaming_llm" || scorer->name == "random";
    EXPECT_EQ(scorer->reads_key_values, !position_or_hash) << scorer->name;
  }
}

TEST_F(RegistryTest, OutputShapesAreListedAndEnforcedByResolve) {
  const ScorerSpec& laprox = *registry_.FindScorer("laprox");
  const ScorerSpec& snapkv = *registry_.FindScorer("snapkv");
  const AllocatorSpec& uniform = *registry_.FindAllocator("uniform");
  const AllocatorSpec& adakv = *registry_.FindAllocator("adakv");
  EXPECT_EQ(PolicyRegistry::OutputShapes(laprox, uniform),
            (std::vector<OutputShape>{OutputShape::kPerHead, OutputShape::kEqualCount}));
  EXPECT_EQ(PolicyRegistry::OutputShapes(snapkv, adakv),
            (std::vector<OutputShape>{OutputShape::kPerHead, OutputShape::kShared,
                                      OutputShape::kBlockAligned, OutputShape::kEqualCount}));
  EXPECT_TRUE(Resolve("laprox", OutputShape::kEqualCount).ok());
  for (const auto& [shape, name] : {std::pair{OutputShape::kShared, "SHARED"},
                                     std::pair{OutputShape::kBlockAligned, "BLOCK_ALIGNED"}}) {
    const auto resolved = Resolve("laprox", shape);
    ASSERT_FALSE(resolved.ok());
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(resolved.status().message(),
              std::string("begin.output_shape: policy 'laprox' answers PER_HEAD or EQUAL_COUNT "
                          "lists, not ") + name);
  }
  EXPECT_TRUE(Resolve("criticalkv_adakv", OutputShape::kShared).ok());
}

}  // namespace
}  // namespace kvtrim
