// The parity rule itself (tests/gpu/parity_rule.h) on hand-made decisions: what it accepts
// and what it rejects. Needs no GPU, so CI runs it.
#include "tests/gpu/parity_rule.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/registry.h"
#include "tests/gpu/policy_test_setup.h"

namespace kvtrim::gpu::testing {
namespace {

using ::testing::HasSubstr;

/// A resolved policy (for its allocator name).
ResolvedPolicy Resolve(const std::string& name) {
  CompressionSettings settings;
  settings.policy = name;
  auto policy = BuiltinRegistry().Resolve(settings, "settings");
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *policy;
}

/// A per-head decision from lists [H][k_h].
LayerDecision PerHead(const std::vector<std::vector<int32_t>>& lists, int64_t n) {
  LayerDecision d;
  d.num_tokens = n;
  d.offsets = {0};
  for (const auto& list : lists) {
    d.indices.insert(d.indices.end(), list.begin(), list.end());
    d.offsets.push_back(static_cast<int64_t>(d.indices.size()));
    d.kept_per_head.push_back(static_cast<int32_t>(list.size()));
  }
  return d;
}

/// A shared decision for `heads` heads.
LayerDecision Shared(const std::vector<int32_t>& list, int64_t heads, int64_t n) {
  LayerDecision d;
  d.num_tokens = n;
  d.output_shape = OutputShape::kShared;
  d.indices = list;
  d.offsets = {0, static_cast<int64_t>(list.size())};
  d.kept_per_head.assign(static_cast<size_t>(heads), static_cast<int32_t>(list.size()));
  return d;
}

CaseSpec Case(DType dtype, int64_t heads, int64_t n) {
  CaseSpec c;
  c.policy = "test";
  c.dtype = dtype;
  c.num_kv_heads = heads;
  c.n = n;
  c.d = 64;
  c.group = 1;
  c.window = 1;
  return c;
}

// One head, n = 10, k = 7: the CPU keeps tokens 0..6; token 6 (score 4.0) is the boundary.
const std::vector<float> kScores = {10, 9, 8, 7, 6, 5, 4, 3.99f, 3, 2};
const std::vector<int32_t> kCpuList = {0, 1, 2, 3, 4, 5, 6};

std::function<CpuScores()> Scores(std::vector<float> scores, int64_t safeguard = 0) {
  return [scores, safeguard] { return CpuScores{scores, safeguard, {}}; };
}

TEST(ParityRuleTest, IdenticalDecisionsAreExact) {
  const LayerDecision cpu = PerHead({kCpuList}, 10);
  const Outcome out = CompareDecisions(Case(DType::kF32, 1, 10), Resolve("knorm"), cpu, cpu,
                                       Scores(kScores), /*exact_required=*/true);
  EXPECT_TRUE(out.exact);
  EXPECT_EQ(out.failure, "");
}

TEST(ParityRuleTest, ExactModeRejectsAnyDifferenceAndNamesTheCase) {
  const LayerDecision cpu = PerHead({kCpuList}, 10);
  const LayerDecision gpu = PerHead({{0, 1, 2, 3, 4, 5, 7}}, 10);
  const Outcome out = CompareDecisions(Case(DType::kF32, 1, 10), Resolve("knorm"), cpu, gpu,
                                       Scores(kScores), true);
  EXPECT_FALSE(out.exact);
  EXPECT_THAT(out.failure, HasSubstr("policy=test dtype=f32 n=10 d=64 G=1"));
  EXPECT_THAT(out.failure, HasSubstr("head=0"));
  EXPECT_THAT(out.failure, HasSubstr("position 6: cpu=6 gpu=7"));
}

TEST(ParityRuleTest, ToleranceAcceptsASwapAtTheBoundary) {
  // Token 7 (3.99) is within 4 * 2^-7 * 4.0 = 0.125 of the boundary 4.0.
  const LayerDecision cpu = PerHead({kCpuList}, 10);
  const LayerDecision gpu = PerHead({{0, 1, 2, 3, 4, 5, 7}}, 10);
  const Outcome out = CompareDecisions(Case(DType::kBF16, 1, 10), Resolve("knorm"), cpu, gpu,
                                       Scores(kScores), false);
  EXPECT_FALSE(out.exact);
  EXPECT_EQ(out.failure, "");
}

TEST(ParityRuleTest, ToleranceRejectsATokenFarFromTheBoundary) {
  const LayerDecision cpu = PerHead({kCpuList}, 10);
  const LayerDecision gpu = PerHead({{0, 1, 2, 3, 4, 5, 8}}, 10);  // token 8 scores 3.0
  const Outcome out = CompareDecisions(Case(DType::kBF16, 1, 10), Resolve("knorm"), cpu, gpu,
                                       Scores(kScores), false);
  EXPECT_THAT(out.failure, HasSubstr("token 8"));
  EXPECT_THAT(out.failure, HasSubstr("not within 4*eps_bf16"));
}

TEST(ParityRuleTest, ToleranceIsTighterForF16) {
  // 3.98 is 0.02 from the boundary 4.0: inside bf16's 4 * 2^-7 * 4 = 0.125, outside f16's
  // 4 * 2^-10 * 4 = 0.0156.
  std::vector<float> scores = kScores;
  scores[7] = 3.98f;
  const LayerDecision cpu = PerHead({kCpuList}, 10);
  const LayerDecision gpu = PerHead({{0, 1, 2, 3, 4, 5, 7}}, 10);
  EXPECT_EQ(CompareDecisions(Case(DType::kBF16, 1, 10), Resolve("knorm"), cpu, gpu,
                             Scores(scores), false).failure, "");
  EXPECT_THAT(CompareDecisions(Case(DType::kF16, 1, 10), Resolve("knorm"), cpu, gpu,
                               Scores(scores), false).failure,
              HasSubstr("not within 4*eps_f16"));
}

TEST(ParityRuleTest, ProtectedTokensNeverDiffer) {
  // Tokens 6 and 9 are protected (+inf). The GPU keeps token 5 (5.99, next to the boundary
  // 6.0 of token 4) instead of the protected token 9: token 5 passes, token 9 must not.
  std::vector<float> scores = kScores;
  const float inf = std::numeric_limits<float>::infinity();
  scores[5] = 5.99f;
  scores[6] = inf;
  scores[9] = inf;
  const LayerDecision cpu = PerHead({{0, 1, 2, 3, 4, 6, 9}}, 10);
  const LayerDecision gpu = PerHead({{0, 1, 2, 3, 4, 5, 6}}, 10);
  EXPECT_THAT(CompareDecisions(Case(DType::kBF16, 1, 10), Resolve("knorm"), cpu, gpu,
                               Scores(scores), false).failure,
              HasSubstr("token 9"));
}

TEST(ParityRuleTest, CountsMayMoveBetweenHeadsOnlyUnderAdaKV) {
  // Two heads; safeguard 1. The CPU gives head 0 three tokens and head 1 one; its extra-pool
  // threshold is head 0's third score, 5.0. The GPU moves that slot to head 1's token 1,
  // scoring 4.99 (within 4 * 2^-7 * 5).
  std::vector<float> scores = {9, 8, 5, 1, 0, 7, 4.99f, 1, 0, 0};  // [2, 5]
  const LayerDecision cpu = PerHead({{0, 1, 2}, {0}}, 5);
  const LayerDecision gpu = PerHead({{0, 1}, {0, 1}}, 5);
  CaseSpec c = Case(DType::kBF16, 2, 5);
  EXPECT_EQ(CompareDecisions(c, Resolve("knorm+adakv"), cpu, gpu, Scores(scores, 1), false).failure,
            "");
  EXPECT_THAT(CompareDecisions(c, Resolve("knorm"), cpu, gpu, Scores(scores), false).failure,
              HasSubstr("kept counts differ"));
}

TEST(ParityRuleTest, SharedListsUseTheRoundRobinBoundary) {
  // Two heads, n = 6, shared count 3. Head 0 ranks 0,1,2,...; head 1 ranks 3,4,5,... The
  // round robin takes 0, 3, then 1 (rank 1 of head 0) and stops at rank 1. Token 4 (head 1's
  // rank 1) may replace token 1 (head 0's rank 1); token 5 scoring 2 in head 1 may not.
  std::vector<float> scores = {10, 8, 6, 1, 1, 1,   //
                               1, 1, 1, 9, 7, 6.99f};
  const LayerDecision cpu = Shared({0, 1, 3}, 2, 6);
  EXPECT_EQ(CompareDecisions(Case(DType::kBF16, 2, 6), Resolve("knorm"), cpu,
                             Shared({0, 3, 4}, 2, 6), Scores(scores), false).failure,
            "");
  EXPECT_THAT(CompareDecisions(Case(DType::kBF16, 2, 6), Resolve("knorm"), cpu,
                               Shared({0, 3, 5}, 2, 6), Scores({10, 8, 6, 1, 1, 1, 1, 1, 1, 9, 7, 2}),
                               false).failure,
              HasSubstr("token 5"));
}

TEST(ParityRuleTest, PerturbationWithinOneInABillion) {
  LayerDecision cpu = PerHead({kCpuList}, 10);
  LayerDecision gpu = cpu;
  cpu.perturbation = {0.25};
  gpu.perturbation = {0.25 * (1 + 5e-10)};
  EXPECT_EQ(CompareDecisions(Case(DType::kF32, 1, 10), Resolve("knorm"), cpu, gpu,
                             Scores(kScores), true).failure,
            "");
  gpu.perturbation = {0.25 * (1 + 5e-9)};
  EXPECT_THAT(CompareDecisions(Case(DType::kF32, 1, 10), Resolve("knorm"), cpu, gpu,
                               Scores(kScores), true).failure,
              HasSubstr("perturbation cpu=0.25"));
}

}  // namespace
}  // namespace kvtrim::gpu::testing
