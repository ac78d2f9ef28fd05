// The profile builder on random calibration dumps: π's order (protection first), the
// profile's shape, nestedness (§9 item 8), budget conservation (§9 item 9), near-exactness
// against the DP (§9 item 7), determinism, and the errors it reports.
#include "kernels/lukv/profile_builder.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/lukv/dp_oracle.h"
#include "kernels/lukv/greedy_solver.h"
#include "kernels/lukv/loss_curves.h"
#include "kernels/lukv/pava.h"

namespace kvtrim::lukv {
namespace {

constexpr int64_t kL = 3, kHkv = 2, kHq = 4, kD = 8, kModelDim = 16;

ModelWeights RandomModel(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  ModelWeights m;
  m.name = "random";
  m.num_layers = kL;
  m.num_query_heads = kHq;
  m.num_kv_heads = kHkv;
  m.head_dim = kD;
  m.hidden_size = kModelDim;
  for (int64_t l = 0; l < kL; ++l) {
    std::vector<float> w(static_cast<size_t>(kModelDim * kHq * kD));
    for (float& x : w) x = normal(rng);
    m.w_o.push_back(F32Tensor::Owning(std::move(w), {1, kModelDim, kHq * kD}));
  }
  return m;
}

CalibrationDump RandomDump(int64_t N, int64_t T, int64_t S, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  CalibrationDump dump;
  dump.source = "random_" + std::to_string(seed);
  dump.dims = {kL, kHkv, kHq, kD, N, T, S};
  auto tensor = [&](int64_t heads) {
    std::vector<float> t(static_cast<size_t>(heads * N * kD));
    for (float& x : t) x = 1.5f * normal(rng);
    return F32Tensor::Owning(std::move(t), {heads, N, kD});
  };
  for (int64_t l = 0; l < kL; ++l) {
    dump.keys.push_back(tensor(kHkv));
    dump.values.push_back(tensor(kHkv));
    dump.queries.push_back(tensor(kHq));
  }
  return dump;
}

ProfileConfig SnapConfig(int threads = 1) {
  ProfileConfig c;
  c.metric = "snapkv";
  c.sink = 2;
  c.window = 6;
  c.num_threads = threads;
  return c;
}

TEST(LukvProfileBuilderTest, PiOrderPutsProtectedTokensFirst) {
  auto builder = ProfileBuilder::Create(SnapConfig(), RandomModel(1));
  ASSERT_TRUE(builder.ok()) << builder.status();
  const CalibrationDump dump = RandomDump(60, 40, 44, 2);
  auto orders = (*builder)->PiOrders(dump, 1);
  ASSERT_TRUE(orders.ok()) << orders.status();
  ASSERT_EQ(orders->size(), static_cast<size_t>(kHkv));
  for (const std::vector<int32_t>& order : *orders) {
    ASSERT_EQ(order.size(), 40u);
    // Sink 0, 1 then the window 34..39, by position.
    EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + 8),
              (std::vector<int32_t>{0, 1, 34, 35, 36, 37, 38, 39}));
    std::vector<int32_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int32_t j = 0; j < 40; ++j) EXPECT_EQ(sorted[j], j);
  }
  // The window parameter followed --window.
  for (const auto& [name, value] : (*builder)->ScorerParams()) {
    if (name == "window") {
      EXPECT_EQ(value.number, 6);
    }
  }
}

TEST(LukvProfileBuilderTest, ProfileIsNestedAndConservesTheBudget) {
  auto builder = ProfileBuilder::Create(SnapConfig(2), RandomModel(3));
  ASSERT_TRUE(builder.ok()) << builder.status();
  EXPECT_EQ((*builder)->Profile().status().code(), absl::StatusCode::kFailedPrecondition);
  int64_t callbacks = 0;
  const int64_t T = 50;
  for (uint32_t q = 0; q < 3; ++q) {
    ASSERT_TRUE((*builder)->AddDump(RandomDump(70, T, 52 + q, 10 + q),
                                    [&](int64_t) { ++callbacks; }).ok());
  }
  EXPECT_EQ(callbacks, 3 * kL);
  EXPECT_EQ((*builder)->num_dumps(), 3);
  auto phi = (*builder)->Profile();
  ASSERT_TRUE(phi.ok());
  ASSERT_EQ(phi->size(), static_cast<size_t>(kGridRows * kL * kHkv));
  const int64_t heads = kL * kHkv;
  for (int row = 0; row < kGridRows; ++row) {
    double mean = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const float r = (*phi)[row * heads + h];
      EXPECT_GE(r, 0.0f);
      EXPECT_LE(r, 0.99f);  // 1 - Φ >= 0.01
      if (row > 0) {
        EXPECT_GE(r, (*phi)[(row - 1) * heads + h]);  // §9 item 8
      }
      mean += r / static_cast<double>(heads);
    }
    EXPECT_NEAR(mean, GridRatio(row), 1.0 / T) << "row " << row;  // §9 item 9
  }
}

TEST(LukvProfileBuilderTest, DeterministicAcrossThreadCounts) {
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    ProfileConfig config = SnapConfig(threads);
    config.oracle.gqa = GqaAggregation::kMax;
    auto builder = ProfileBuilder::Create(config, RandomModel(4));
    ASSERT_TRUE(builder.ok());
    ASSERT_TRUE((*builder)->AddDump(RandomDump(40, 30, 33, 5)).ok());
    results.push_back(*(*builder)->Profile());
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(LukvProfileBuilderTest, NearExactAgainstDpOnDumps) {  // §9 item 7 on dump data
  ProfileConfig config;
  config.metric = "knorm";
  auto builder = ProfileBuilder::Create(config, RandomModel(6));
  ASSERT_TRUE(builder.ok()) << builder.status();
  const CalibrationDump dump = RandomDump(45, 24, 30, 7);
  auto d = (*builder)->RawGains(dump);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<std::vector<double>> raw, gains, relaxed;
  double bound = 0;
  for (const std::vector<double>& head : *d) {
    raw.push_back(RawLossCurve(head));
    gains.push_back(AntitonicPava(head));
    relaxed.push_back(SurrogateCurve(raw.back()[0], gains.back()));
    for (size_t i = 0; i < raw.back().size(); ++i) {
      bound = std::max(bound, raw.back()[i] - relaxed.back()[i]);
    }
  }
  // Each layer's normalised importance sums to 1 over its heads.
  for (int64_t l = 0; l < kL; ++l) {
    EXPECT_NEAR(raw[l * kHkv][0] + raw[l * kHkv + 1][0], 1.0, 1e-12);
  }
  const int64_t heads = kL * kHkv, T = 24;
  std::vector<int64_t> budgets;
  for (int row = kGridRows - 1; row >= 0; row -= 7) {
    budgets.push_back(std::max(GridBudget(row, heads, T), heads * RetentionFloor(T)));
  }
  const auto alloc = GreedyAllocate(gains, RetentionFloor(T), budgets);
  for (size_t i = 0; i < budgets.size(); ++i) {
    const DpSolution relaxed_dp = SolveMckpExact(relaxed, budgets[i], RetentionFloor(T));
    const DpSolution raw_dp = SolveMckpExact(raw, budgets[i], RetentionFloor(T));
    ASSERT_TRUE(relaxed_dp.feasible && raw_dp.feasible);
    EXPECT_NEAR(CurvesValue(relaxed, alloc[i]), relaxed_dp.value, 1e-12);
    EXPECT_LE(CurvesValue(raw, alloc[i]) - raw_dp.value, bound + 1e-12);
  }
}

TEST(LukvProfileBuilderTest, EveryModelFreeScorerBuildsAProfile) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  int built = 0;
  for (const ScorerSpec* scorer : registry.scorers()) {
    if (scorer->required_inputs & kInputModel) continue;
    ProfileConfig config = SnapConfig();
    config.metric = scorer->name;
    auto builder = ProfileBuilder::Create(config, RandomModel(8));
    ASSERT_TRUE(builder.ok()) << scorer->name << ": " << builder.status();
    ASSERT_TRUE((*builder)->AddDump(RandomDump(50, 36, 40, 9)).ok()) << scorer->name;
    auto phi = (*builder)->Profile();
    ASSERT_TRUE(phi.ok());
    const int64_t heads = kL * kHkv;
    for (int row = 1; row < kGridRows; ++row) {
      for (int64_t h = 0; h < heads; ++h) {
        EXPECT_GE((*phi)[row * heads + h], (*phi)[(row - 1) * heads + h]) << scorer->name;
      }
    }
    ++built;
  }
  EXPECT_GE(built, 6);
}

TEST(LukvProfileBuilderTest, Errors) {
  ProfileConfig config = SnapConfig();
  config.metric = "expected_attention";
  EXPECT_EQ(ProfileBuilder::Create(config, RandomModel(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.metric = "nope";
  EXPECT_FALSE(ProfileBuilder::Create(config, RandomModel(1)).ok());
  config.metric = "snapkv+adakv";
  EXPECT_FALSE(ProfileBuilder::Create(config, RandomModel(1)).ok());
  config = SnapConfig();
  config.params["kernel"] = ParamValue::Number(4);  // even kernel: refused per layer
  auto builder = ProfileBuilder::Create(config, RandomModel(1));
  ASSERT_TRUE(builder.ok());
  EXPECT_FALSE((*builder)->AddDump(RandomDump(60, 40, 44, 2)).ok());
  builder = ProfileBuilder::Create(SnapConfig(), RandomModel(1));
  CalibrationDump bad = RandomDump(60, 40, 44, 2);
  bad.dims.decode_start = 60;  // no decode step
  EXPECT_FALSE((*builder)->AddDump(bad).ok());
  bad = RandomDump(60, 40, 44, 2);
  bad.keys.pop_back();
  EXPECT_FALSE((*builder)->AddDump(bad).ok());
  EXPECT_EQ((*builder)->num_dumps(), 0);
  config = SnapConfig();
  config.metric = "h2o";  // reads the last `window` query rows: 0 is refused, not a crash
  config.window = 0;
  builder = ProfileBuilder::Create(config, RandomModel(1));
  ASSERT_TRUE(builder.ok()) << builder.status();
  EXPECT_FALSE((*builder)->AddDump(RandomDump(60, 40, 44, 2)).ok());
}

}  // namespace
}  // namespace kvtrim::lukv
