// max_perturbation budgets through PolicyEngine on the CPU backend, against brute force:
// every k of a small random layer compressed with keep_tokens = k (the same policy, numerics
// and statistic). Per head: the answer is the rule's k on that table, its list is the
// keep_tokens = k list, its statistic that k's, <= epsilon unless capped, and the smallest k
// within epsilon where the table is monotone. Exact and fast numerics, FULL and SAMPLED.
// Then the errors, each with its code and field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/engine.h"
#include "kernels/decide/perturbation_budget.h"
#include "kernels/decide/perturbation_budget_reference.h"
#include "tests/testing/random_layer_test_util.h"
#include "kernels/registry.h"

namespace kvtrim {
namespace {

constexpr int64_t kHeads = 3, kTokens = 48, kDim = 16, kQueryHeads = 6, kWindow = 12;

/// One policy configuration under test.
struct Case {
  std::string policy;
  Numerics numerics = Numerics::kExact;
  bool sampled = false;
  std::optional<int64_t> recent;  // fixes a k-dependent protection (h2o's recent fraction)
};

std::vector<int32_t> Head(const LayerDecision& d, int64_t h) {
  return std::vector<int32_t>(d.indices.begin() + d.offsets[h],
                              d.indices.begin() + d.offsets[h + 1]);
}

/// The engine on a two-thread CPU backend and the brute-force comparison.
class PerturbationBudgetBruteForceTest : public ::testing::Test {
 protected:
  PerturbationBudgetBruteForceTest() : backend_(2), engine_(registry_, backend_) {
    RegisterBuiltinPolicies(&registry_);
  }

  CompressionSettings Settings(const Case& c) const {
    CompressionSettings s;
    s.policy = c.policy;
    s.numerics = c.numerics;
    s.perturbation_sampled = c.sampled;
    s.recent_tokens = c.recent;
    if (c.policy == "snapkv") s.params["window"] = ParamValue::Number(kWindow);
    return s;
  }

  /// keep_tokens = k for every k in [1, cap]: decisions[k].
  std::vector<LayerDecision> BruteForce(const Case& c, const LayerRequest& layer, int64_t cap) {
    std::vector<LayerDecision> out(static_cast<size_t>(cap + 1));
    for (int64_t k = 1; k <= cap; ++k) {
      CompressionSettings s = Settings(c);
      s.budget = Budget{false, 0, k};
      auto policy = engine_.Prepare(s, "settings");
      EXPECT_TRUE(policy.ok()) << policy.status();
      auto decision = engine_.CompressLayer(*policy, layer, "layers[0]");
      EXPECT_TRUE(decision.ok()) << decision.status();
      out[static_cast<size_t>(k)] = *decision;
    }
    return out;
  }

  absl::StatusOr<LayerDecision> Targeted(const Case& c, const LayerRequest& layer,
                                         double epsilon, double cap) {
    CompressionSettings s = Settings(c);
    s.budget.by_fraction = true;
    s.budget.keep_fraction = cap;
    s.budget.by_perturbation = true;
    s.budget.epsilon = epsilon;
    auto policy = engine_.Prepare(s, "settings");
    if (!policy.ok()) return policy.status();
    return engine_.CompressLayer(*policy, layer, "layers[0]");
  }

  /// Compresses `layer` under max_perturbation for five epsilons around head 0's table
  /// (none reachable, half its least, its median, its loosest, everything) and checks every
  /// head against the brute-force table. Returns how many (epsilon, head) tables were
  /// monotone (non-increasing in k), where k must also be the smallest within epsilon.
  int CheckAgainstBruteForce(const Case& c, const LayerRequest& layer, double cap_fraction) {
    const int64_t heads = layer.keys.shape[0], n = layer.keys.shape[1];
    const int64_t w = layer.queries.shape[1];
    const int64_t cap = KeptCount(Budget{true, cap_fraction, 0}, n);
    const std::vector<LayerDecision> table = BruteForce(c, layer, cap);
    // k_min: the policy's protection at the cap (kept by every keep_tokens = k >= k_min).
    CompressionSettings at_cap = Settings(c);
    at_cap.budget = Budget{true, cap_fraction, 0};
    const ResolvedPolicy resolved = *engine_.Prepare(at_cap, "settings");
    const Protection p = BudgetFor(resolved, n).protection;
    const int64_t k_min = std::max<int64_t>(1, p.sink + p.recent);
    std::vector<double> sorted;
    for (int64_t k = k_min; k <= cap; ++k) sorted.push_back(table[k].perturbation[0]);
    std::sort(sorted.begin(), sorted.end());
    const std::vector<double> epsilons = {0.0, sorted.front() * 0.5, sorted[sorted.size() / 2],
                                          sorted.back(), 10.0};
    int monotone_heads = 0;
    for (double epsilon : epsilons) {
      auto decision = Targeted(c, layer, epsilon, cap_fraction);
      EXPECT_TRUE(decision.ok()) << decision.status();
      if (!decision.ok() || decision->offsets.size() != static_cast<size_t>(heads + 1)) {
        ADD_FAILURE() << c.policy << ": no per-head answer";
        return monotone_heads;
      }
      EXPECT_EQ(decision->output_shape, OutputShape::kPerHead);
      EXPECT_EQ(decision->numerics, table[1].numerics);
      EXPECT_EQ(decision->perturbation_rows, table[1].perturbation_rows);
      EXPECT_EQ(decision->perturbation_sampled,
                c.sampled && c.numerics == Numerics::kFast && w > kSampledPerturbationRows);
      for (int64_t h = 0; h < heads; ++h) {
        const std::string where = c.policy + " head " + std::to_string(h) + " epsilon " +
                                  std::to_string(epsilon);
        // The rule on the table.
        auto e = [&](int64_t k) { return table[static_cast<size_t>(k)].perturbation[h]; };
        const int64_t expect = ReferenceK(e, k_min, cap, epsilon);
        const int64_t k = decision->kept_per_head[h];
        EXPECT_EQ(k, expect) << where;
        EXPECT_EQ(Head(*decision, h), Head(table[static_cast<size_t>(k)], h)) << where;
        EXPECT_EQ(decision->perturbation[h], e(k)) << where;
        if (k < cap) EXPECT_LE(decision->perturbation[h], epsilon) << where;
        bool monotone = true;
        for (int64_t j = k_min; j < cap; ++j) monotone = monotone && e(j + 1) <= e(j);
        if (!monotone) continue;
        ++monotone_heads;
        int64_t smallest = cap;
        for (int64_t j = k_min; j <= cap; ++j) {
          if (e(j) <= epsilon) {
            smallest = j;
            break;
          }
        }
        EXPECT_EQ(k, smallest) << where << " (monotone)";
      }
    }
    return monotone_heads;
  }

  PolicyRegistry registry_;
  CpuBackend backend_;
  PolicyEngine engine_;
};

/// The brute-force comparison over the policy cases below.
class PerturbationBudgetCpuTest : public PerturbationBudgetBruteForceTest,
                                  public ::testing::WithParamInterface<Case> {};

TEST_P(PerturbationBudgetCpuTest, MatchesTheRuleOnTheBruteForceTable) {
  RandomLayer layer(kHeads, kTokens, kDim, kQueryHeads, kWindow, /*seed=*/17);
  const int monotone = CheckAgainstBruteForce(GetParam(), layer.request, /*cap_fraction=*/0.75);
  std::printf("%s: %d of %d head tables monotone\n", GetParam().policy.c_str(), monotone,
              static_cast<int>(5 * kHeads));
}

INSTANTIATE_TEST_SUITE_P(
    Policies, PerturbationBudgetCpuTest,
    ::testing::Values(Case{"dropkv", Numerics::kExact}, Case{"dropkv", Numerics::kFast},
                      Case{"dropkv", Numerics::kFast, /*sampled=*/true},
                      Case{"snapkv", Numerics::kExact}, Case{"snapkv", Numerics::kFast},
                      Case{"knorm", Numerics::kExact}, Case{"tova", Numerics::kFast},
                      Case{"streaming_llm", Numerics::kExact},
                      Case{"h2o", Numerics::kExact, false, /*recent=*/4}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.policy + (info.param.numerics == Numerics::kFast ? "_fast" : "_exact") +
             (info.param.sampled ? "_sampled" : "");
    });

/// A layer whose statistic is non-increasing in k by construction: one window row, orthogonal
/// values (v_j = e_j) and one token holding more than half the attention. With h2o's ranking
/// (score = the row's attention, recent_tokens 0) every kept set has mass P >= 1/2, and adding
/// a token of weight p changes ||a_kept - a_full||^2 = Q (1/P - 1)^2 + (Q_all - Q) by
/// Q [(1/P' - 1)^2 - (1/P - 1)^2] + p^2 [(1/P' - 1)^2 - 1] <= 0. There the answer must be
/// the smallest k within epsilon, which brute force checks.
TEST_F(PerturbationBudgetBruteForceTest, MonotoneStatisticGivesTheSmallestKWithinEpsilon) {
  constexpr int64_t kH = 2, kN = 24, kD = 32;
  RandomLayer layer(kH, kN, kD, /*hq=*/kH, /*w=*/1, /*seed=*/5);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> logit(-2.0f, 1.0f);
  std::fill(layer.k.begin(), layer.k.end(), 0.0f);
  std::fill(layer.v.begin(), layer.v.end(), 0.0f);
  std::fill(layer.q.begin(), layer.q.end(), 0.0f);
  for (int64_t h = 0; h < kH; ++h) {
    layer.q[static_cast<size_t>(h * kD)] = 1.0f;
    const int64_t heavy = 3 + 7 * h;  // the token holding most of the attention
    for (int64_t j = 0; j < kN; ++j) {
      // Logits scaled by 1/sqrt(d) in the softmax: keys carry sqrt(d) * logit.
      const float l = j == heavy ? 5.0f : logit(rng);
      layer.k[static_cast<size_t>((h * kN + j) * kD)] = l * std::sqrt(static_cast<float>(kD));
      layer.v[static_cast<size_t>((h * kN + j) * kD + j)] = 1.0f;
    }
  }
  Case c{"h2o", Numerics::kExact, false, /*recent=*/0};
  const int monotone = CheckAgainstBruteForce(c, layer.request, /*cap_fraction=*/0.75);
  EXPECT_EQ(monotone, 5 * kH);  // every (epsilon, head) table is monotone
}

/// An epsilon above any statistic keeps the protected floor (dropkv's window); epsilon 0 keeps
/// the cap on random inputs, where every dropped token changes the output.
TEST(PerturbationBudgetCpuSmallTest, LoosestEpsilonKeepsTheProtectedFloor) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend backend(1);
  PolicyEngine engine(registry, backend);
  RandomLayer layer(2, 40, 8, 4, 8);
  CompressionSettings s;
  s.policy = "dropkv";  // window 8 protected: k_min = 8
  s.numerics = Numerics::kExact;
  s.budget = Budget{true, 0.5, 0, true, 1e9};
  auto policy = engine.Prepare(s, "settings");
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto decision = engine.CompressLayer(*policy, layer.request, "layers[0]");
  ASSERT_TRUE(decision.ok()) << decision.status();
  EXPECT_EQ(decision->kept_per_head, (std::vector<int32_t>{8, 8}));
  EXPECT_EQ(Head(*decision, 0), (std::vector<int32_t>{32, 33, 34, 35, 36, 37, 38, 39}));
  // epsilon 0 on random inputs: every head's output changes below the cap, so k = k_cap.
  s.budget.epsilon = 0;
  policy = engine.Prepare(s, "settings");
  decision = engine.CompressLayer(*policy, layer.request, "layers[0]");
  ASSERT_TRUE(decision.ok()) << decision.status();
  EXPECT_EQ(decision->kept_per_head, (std::vector<int32_t>{20, 20}));
}

class PerturbationBudgetErrorTest : public ::testing::Test {
 protected:
  PerturbationBudgetErrorTest() : backend_(1), engine_(registry_, backend_) {
    RegisterBuiltinPolicies(&registry_);
    settings_.policy = "dropkv";
    settings_.budget = Budget{true, 0.5, 0, true, 0.05};
  }

  void ExpectPrepareError(const CompressionSettings& s, const std::string& prefix) {
    auto r = engine_.Prepare(s, "settings");
    ASSERT_FALSE(r.ok()) << "expected " << prefix;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message().substr(0, prefix.size()), prefix) << r.status();
  }

  PolicyRegistry registry_;
  CpuBackend backend_;
  PolicyEngine engine_;
  CompressionSettings settings_;
};

TEST_F(PerturbationBudgetErrorTest, BadNumbersNameTheirField) {
  CompressionSettings s = settings_;
  s.budget.epsilon = std::numeric_limits<double>::quiet_NaN();
  const std::string epsilon = "settings.budget.max_perturbation.epsilon: must be finite and >= 0";
  ExpectPrepareError(s, epsilon + ", got nan");
  s.budget.epsilon = -0.25;
  ExpectPrepareError(s, epsilon + ", got -0.25");
  s.budget.epsilon = std::numeric_limits<double>::infinity();
  ExpectPrepareError(s, epsilon + ", got inf");
  s.budget.epsilon = 0.1;
  s.budget.keep_fraction = 1.5;
  ExpectPrepareError(s, "settings.budget.max_perturbation.max_keep_fraction: must be in (0, 1] "
                        "(0 = 1), got 1.5");
}

TEST_F(PerturbationBudgetErrorTest, SettingsItCannotServeNameTheirField) {
  CompressionSettings s = settings_;
  s.perturbation = false;
  ExpectPrepareError(s, "settings.perturbation: ");
  s = settings_;
  for (OutputShape shape :
       {OutputShape::kEqualCount, OutputShape::kShared, OutputShape::kBlockAligned}) {
    s.output_shape = shape;
    s.block_size = 4;
    ExpectPrepareError(s, "settings.output_shape: ");
  }
  s = settings_;
  s.policy = "criticalkv";
  ExpectPrepareError(s, "settings.policy.name: ");
}

TEST_F(PerturbationBudgetErrorTest, LayersWithoutValuesOrQueriesAreRefused) {
  auto policy = engine_.Prepare(settings_, "settings");
  ASSERT_TRUE(policy.ok()) << policy.status();
  RandomLayer layer(2, 40, 8, 4, 8);
  LayerRequest no_values = layer.request;
  no_values.values = {};
  auto r = engine_.CompressLayer(*policy, no_values, "layers[0]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().substr(0, 18), "layers[0].values: ") << r.status();
  CompressionSettings knorm = settings_;
  knorm.policy = "knorm";  // a scorer that reads neither: the budget still needs both
  policy = engine_.Prepare(knorm, "settings");
  ASSERT_TRUE(policy.ok());
  LayerRequest no_queries = layer.request;
  no_queries.queries = {};
  r = engine_.CompressLayer(*policy, no_queries, "layers[0]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().substr(0, 19), "layers[0].queries: ") << r.status();
}

TEST_F(PerturbationBudgetErrorTest, LaProxRanksEachHeadSoIsNotModelWide) {
  CompressionSettings s = settings_;
  s.policy = "laprox";
  auto policy = engine_.Prepare(s, "settings");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_FALSE(policy->model_wide());
  s.budget = Budget{true, 0.5, 0};
  EXPECT_TRUE(engine_.Prepare(s, "settings")->model_wide());
}

}  // namespace
}  // namespace kvtrim
