// The working set of one layer on the GPU stays O(n) and small (issue 12, "scratch"): the
// arena regions AddPipelineRegions plans for a 128K-token layer, H_kv = 8, G = 4, d = 128,
// w = 32, bf16, keep 0.2, fast numerics.
//
//   PipelineScratch.PerHeadPlansStayWithinTwiceScoresAndIndices
//       every per-head policy on the fused selection (scores, attention and key scorers), the
//       perturbation off: arena <= 2 x (scores [H_kv, n] fp32 + kept indices int32). DropKV
//       adds its split partial outputs [H_kv, G w, splits, d] fp32, a term that does not grow
//       with n (the splits fill the device, about 16.5 MiB on 132 SMs): for it the growth from
//       128K to 256K tokens stays within twice the growth of scores + indices
//   PipelineScratch.SelectionScratchFollowsThePlan
//       the sort storage of shared lists is reserved for shared plans (and AdaKV's radix state
//       for AdaKV) only
// Planning reads shapes only, but sizing the shared sort asks CUB, so these skip without a GPU.
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/runtime/device_pipeline.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/shared_backends.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr int64_t kKvHeads = 8;
constexpr int64_t kGroup = 4;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kWindow = 32;
constexpr int64_t kTokens = 131072;
constexpr double kKeep = 0.2;

/// What a plan of `policy_name` reserves, next to what its answer holds.
struct PlannedArena {
  size_t arena = 0;           // every region AddPipelineRegions adds
  size_t scratch = 0;         // the launchers' scratch region alone
  size_t answer = 0;          // scores [H_kv, n] fp32 + kept indices int32
  bool shared = false;        // the plan selects one shared list
  bool adakv = false;         // the plan allocates with AdaKV
};

/// Plans one layer of `n` tokens of `policy_name` in `shape` (perturbation off) and lays out
/// its arena.
PlannedArena Plan(const std::string& policy_name, OutputShape shape = OutputShape::kPerHead,
                  int64_t n = kTokens) {
  PolicyEngine engine(BuiltinRegistry(), SharedGpu());
  CompressionSettings settings;
  settings.policy = policy_name;
  settings.output_shape = shape;
  settings.budget.by_fraction = true;
  settings.budget.keep_fraction = kKeep;
  settings.numerics = Numerics::kFast;
  settings.perturbation = false;
  absl::StatusOr<ResolvedPolicy> policy = PrepareForRows(engine, settings, kWindow);
  EXPECT_TRUE(policy.ok()) << policy_name << ": " << policy.status();
  if (!policy.ok()) return {};
  LayerShape layer_shape;
  layer_shape.num_kv_heads = kKvHeads;
  layer_shape.num_tokens = n;
  layer_shape.head_dim = kHeadDim;
  layer_shape.num_query_heads = kKvHeads * kGroup;
  layer_shape.window_rows = kWindow;
  layer_shape.has_values = true;
  layer_shape.has_queries = true;
  const LayerBudget budget = BudgetFor(*policy, n);
  absl::StatusOr<LayerPlan> plan = PlanLayer(*policy, layer_shape, DType::kBF16, 0, 1, budget);
  EXPECT_TRUE(plan.ok()) << policy_name << ": " << plan.status();
  if (!plan.ok()) return {};
  // Sizing never dereferences the tensors, but wants them non-null.
  static const char kPlaceholder[16] = {};
  const DeviceLayer layer = MakeDeviceLayer(*plan, layer_shape, DType::kBF16, 0.088f, 0, 5,
                                            kPlaceholder, kPlaceholder, kPlaceholder);
  ArenaLayout layout;
  const PipelineRegions regions = AddPipelineRegions(*plan, layer, &layout);
  PlannedArena out;
  out.arena = layout.total();
  out.scratch = regions.scratch_bytes;
  out.answer = static_cast<size_t>(kKvHeads * n) * sizeof(float) +
               static_cast<size_t>(plan->total_indices) * sizeof(int32_t);
  out.shared = plan->shared;
  out.adakv = plan->adakv;
  return out;
}

TEST(PipelineScratch, PerHeadPlansStayWithinTwiceScoresAndIndices) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (const char* name : {"dropkv", "snapkv", "pyramidkv", "h2o", "tova", "keydiff", "knorm",
                           "streaming_llm", "random"}) {
    const PlannedArena a = Plan(name);
    if (a.answer == 0) continue;  // planning failed, reported above
    std::printf("%-14s arena %.2f MiB (scratch %.2f MiB), scores + indices %.2f MiB\n", name,
                a.arena / 1048576.0, a.scratch / 1048576.0, a.answer / 1048576.0);
    if (std::string(name) == "dropkv") {
      const PlannedArena twice = Plan(name, OutputShape::kPerHead, 2 * kTokens);
      EXPECT_LE(twice.arena - a.arena, 2 * (twice.answer - a.answer))
          << "dropkv: arena " << a.arena << " -> " << twice.arena << " B from n to 2n";
      continue;
    }
    EXPECT_LE(a.arena, 2 * a.answer) << name << ": arena " << a.arena << " B, scratch "
                                     << a.scratch << " B, scores + indices " << a.answer << " B";
  }
}

TEST(PipelineScratch, SelectionScratchFollowsThePlan) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const size_t sort = SelectSharedScratchBytes(kKvHeads, kTokens);
  const size_t radix = SelectTopKScratchBytes(kKvHeads, kTokens);
  ASSERT_GT(sort, 0u);
  ASSERT_GT(radix, 0u);

  const PlannedArena per_head = Plan("snapkv");
  EXPECT_LT(per_head.scratch, sort) << "a per-head plan reserves the shared sort's storage";

  const PlannedArena shared = Plan("snapkv", OutputShape::kShared);
  ASSERT_TRUE(shared.shared);
  EXPECT_GE(shared.scratch, sort);

  const PlannedArena adakv = Plan("snapkv+adakv");
  ASSERT_TRUE(adakv.adakv);
  EXPECT_GE(adakv.scratch, radix);
  EXPECT_LT(adakv.scratch, sort) << "an AdaKV plan reserves the shared sort's storage";
}

}  // namespace
}  // namespace kvtrim::gpu::testing
