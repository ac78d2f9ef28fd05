// CriticalKV, LaProx and Expected Attention scorers vs the dense fp64 oracle of
// tests/oracle/model_policies_oracle.h (criticalkv.md §2, laprox.md §2.1, baselines.md §7).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/attention_test_layer.h"
#include "kernels/cpu/scorers.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"
#include "tests/oracle/model_policies_oracle.h"

namespace kvtrim {
namespace {

/// The resolved parameters of `policy` with overrides, from the real registry.
ResolvedParams Params(const std::string& policy, std::map<std::string, ParamValue> overrides) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CompressionSettings settings;
  settings.policy = policy;
  settings.params = std::move(overrides);
  auto resolved = registry.Resolve(settings, "settings");
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved->params;
}

/// The oracle's view of the model's layer-0 W_O.
oracle::ProjectionProblem Projection(const RegisteredModel& model, int layer) {
  return {model.layout.hidden_size, model.w_o[layer]};
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (double x : want) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * std::max(std::fabs(want[i]), 1e-3 * scale) + 1e-12)
        << "at " << i;
  }
}

struct Case {
  int64_t h_kv, group, n, d, w, window, hidden;
};

const std::vector<Case> kCases = {
    {1, 1, 40, 8, 8, 8, 16},  {2, 2, 99, 8, 32, 32, 64}, {2, 4, 70, 16, 10, 6, 96},
    {1, 4, 33, 8, 32, 32, 130},
};

TEST(CriticalKVScorerTest, MatchesOracle) {
  uint64_t seed = 10;
  for (const Case& c : kCases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    auto model = RandomModel({1, static_cast<int32_t>(c.h_kv * c.group),
                              static_cast<int32_t>(c.h_kv), static_cast<int32_t>(c.d),
                              static_cast<int32_t>(c.hidden), seed});
    for (const char* norm : {"l1", "l2"}) {
      for (const char* pooling : {"max", "avg"}) {
        SCOPED_TRACE(testing::Message() << "n=" << c.n << " G=" << c.group << " norm=" << norm
                                        << " pooling=" << pooling);
        const ResolvedParams params =
            Params("criticalkv", {{"window", ParamValue::Number(c.window)},
                                  {"norm", ParamValue::Text(norm)},
                                  {"pooling", ParamValue::Text(pooling)}});
        ThreadPool pool(2);
        std::vector<float> att(c.h_kv * c.n), crit(c.h_kv * c.n);
        ASSERT_TRUE(ScoreCriticalKV(MakeLayer(pb), params, *model, pool, att.data(), crit.data())
                        .ok());
        std::vector<double> want_att, want_crit;
        oracle::CriticalKVScores(pb, Projection(*model, 0), c.window, 7,
                                 std::string(pooling) == "max", 1e-4, std::string(norm) == "l1",
                                 &want_att, &want_crit);
        ExpectClose(att, want_att, 1e-5);
        ExpectClose(crit, want_crit, 1e-5);
      }
    }
  }
}

TEST(CriticalKVScorerTest, PoolsEachQueryHeadBeforeTheGroupMean) {
  // Two query heads of one KV head attending to different tokens: max-pool of each head then
  // mean differs from max-pool of the mean; the scorer must follow the former (§2 step 4).
  const oracle::AttentionProblem pb = oracle::RandomProblem(5, 1, 2, 48, 8, 8, 6.0);
  auto model = RandomModel({1, 2, 1, 8, 16, 5});
  const ResolvedParams params = Params("criticalkv", {{"window", ParamValue::Number(8)}});
  ThreadPool pool(1);
  std::vector<float> att(48), crit(48);
  ASSERT_TRUE(ScoreCriticalKV(MakeLayer(pb), params, *model, pool, att.data(), crit.data()).ok());
  // Mean-then-pool reference (the wrong order) must differ somewhere.
  std::vector<double> mean(40, 0.0);
  for (int g = 0; g < 2; ++g) {
    const std::vector<double> P = oracle::ProbMatrix(pb, g);
    for (int t = 0; t < 8; ++t) {
      for (int j = 0; j < 40; ++j) mean[j] += P[t * 48 + j] / 16.0;
    }
  }
  const std::vector<double> wrong = oracle::Pool(mean, 7, true);
  double diff = 0;
  for (int j = 0; j < 40; ++j) diff = std::max(diff, std::fabs(att[j] - wrong[j]));
  EXPECT_GT(diff, 1e-4);
}

TEST(LaProxScorerTest, MatchesOracleForEveryGqaMode) {
  uint64_t seed = 40;
  const char* modes[] = {"mean", "head_bound", "summed_wo"};
  for (const Case& c : kCases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    auto model = RandomModel({1, static_cast<int32_t>(c.h_kv * c.group),
                              static_cast<int32_t>(c.h_kv), static_cast<int32_t>(c.d),
                              static_cast<int32_t>(c.hidden), seed});
    for (int gqa = 0; gqa < 3; ++gqa) {
      SCOPED_TRACE(testing::Message() << "n=" << c.n << " G=" << c.group << " gqa=" << modes[gqa]);
      const ResolvedParams params = Params(
          "laprox", {{"window", ParamValue::Number(c.window)}, {"gqa", ParamValue::Text(modes[gqa])}});
      ThreadPool pool(2);
      std::vector<float> got(c.h_kv * c.n);
      ASSERT_TRUE(ScoreLaProx(MakeLayer(pb), params, *model, pool, got.data()).ok());
      ExpectClose(got, oracle::LaProxScores(pb, Projection(*model, 0), c.window, 7, false, gqa),
                  1e-5);
    }
  }
}

TEST(LaProxScorerTest, GramNormEqualsTheDenseProjection) {
  // P3: ||v W_O^h||_2^2 = v Gram_h v^T (the Gram form the sidecar registers).
  auto model = RandomModel({1, 4, 2, 16, 128, 3});
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  const int64_t d = 16, D = 128, hq = 4;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> v(d);
    for (auto& x : v) x = normal(rng);
    for (int64_t h = 0; h < hq; ++h) {
      double dense = 0, quad = 0;
      for (int64_t e = 0; e < D; ++e) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i) acc += v[i] * model->w_o[0][e * hq * d + h * d + i];
        dense += acc * acc;
      }
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t k = 0; k < d; ++k) quad += v[i] * model->head_gram[0][(h * d + i) * d + k] * v[k];
      }
      EXPECT_NEAR(quad, dense, 1e-5 * dense);
    }
  }
}

TEST(ExpectedAttentionScorerTest, MatchesOracleWithRegisteredStatistics) {
  uint64_t seed = 70;
  for (const Case& c : kCases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 1.0);
    RandomModelOptions o =
        RandomModelLayout(1, static_cast<int32_t>(c.h_kv * c.group), static_cast<int32_t>(c.h_kv),
                          static_cast<int32_t>(c.d), static_cast<int32_t>(c.hidden), seed);
    o.query_stats = true;
    for (bool interleaved : {false, true}) {
      ModelInput input = RandomModelInput(o);
      input.rope_theta = 500.0;
      input.rope_layout = interleaved ? "interleaved" : "rotate_half";
      auto model = BuildModel(input);
      ASSERT_TRUE(model.ok()) << model.status();
      std::vector<double> mean((*model)->query_mean[0].begin(), (*model)->query_mean[0].end());
      std::vector<double> cov((*model)->query_cov[0].begin(), (*model)->query_cov[0].end());
      for (bool vnorm : {true, false}) {
        SCOPED_TRACE(testing::Message() << "n=" << c.n << " interleaved=" << interleaved
                                        << " vnorm=" << vnorm);
        const ResolvedParams params =
            Params("expected_attention", {{"query_stats", ParamValue::Text("model")},
                                          {"n_future_positions", ParamValue::Number(64)},
                                          {"use_vnorm", ParamValue::Number(vnorm ? 1 : 0)}});
        ThreadPool pool(2);
        std::vector<float> got(c.h_kv * c.n);
        ASSERT_TRUE(ScoreExpectedAttention(MakeLayer(pb), params, **model, pool, got.data()).ok());
        ExpectClose(got,
                    oracle::ExpectedAttentionScores(pb, mean, cov,
                                                    (*model)->rope.InverseFrequencies(c.d),
                                                    interleaved, 64, 0.02, vnorm),
                    2e-5);
      }
    }
  }
}

TEST(ExpectedAttentionScorerTest, WindowStatisticsUnRotateThePostRopeQueries) {
  // Queries sent post-RoPE at positions n - w + t; the scorer must recover the pre-RoPE
  // statistics: its scores equal the oracle's on the mean/covariance of the pre-RoPE rows.
  oracle::AttentionProblem pb = oracle::RandomProblem(9, 2, 2, 50, 8, 12, 1.0);
  RandomModelOptions o = RandomModelLayout(1, 4, 2, 8, 16, 9);
  ModelInput input = RandomModelInput(o);
  input.rope_theta = 100.0;
  auto model = BuildModel(input);
  ASSERT_TRUE(model.ok());
  const std::vector<double> inv = (*model)->rope.InverseFrequencies(8);
  const int64_t d = 8, w = 12, n = 50;
  std::vector<double> mean(4 * d, 0.0), cov(4 * d * d, 0.0);
  std::vector<float> rotated = pb.queries;  // pre-RoPE rows, rotated in place
  for (int64_t q = 0; q < 4; ++q) {
    for (int64_t t = 0; t < w; ++t) {
      const float* pre = pb.queries.data() + (q * w + t) * d;
      for (int64_t i = 0; i < d; ++i) mean[q * d + i] += pre[i] / static_cast<double>(w);
      const std::vector<double> r = oracle::RopeMatrix(inv, false, n - w + t);
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < d; ++k) acc += r[i * d + k] * pre[k];
        rotated[(q * w + t) * d + i] = static_cast<float>(acc);
      }
    }
    for (int64_t t = 0; t < w; ++t) {
      const float* pre = pb.queries.data() + (q * w + t) * d;
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          cov[(q * d + i) * d + k] +=
              (pre[i] - mean[q * d + i]) * (pre[k] - mean[q * d + k]) / static_cast<double>(w);
        }
      }
    }
  }
  const std::vector<double> want =
      oracle::ExpectedAttentionScores(pb, mean, cov, inv, false, 512, 0.02, true);
  pb.queries = rotated;
  const ResolvedParams params = Params("expected_attention", {});  // auto -> window
  ThreadPool pool(1);
  std::vector<float> got(2 * n);
  ASSERT_TRUE(ScoreExpectedAttention(MakeLayer(pb), params, **model, pool, got.data()).ok());
  ExpectClose(got, want, 1e-4);
}

// The engine refuses query_stats=model for a model without statistics (AttachModel,
// engine_test.cc); the scorer's own test is the INTERNAL guard of a caller that skipped it.
TEST(ExpectedAttentionScorerTest, ModelStatisticsMissingIsAnInternalGuard) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(2, 1, 2, 20, 8, 4, 1.0);
  auto model = RandomModel({1, 2, 1, 8, 16, 2});
  ThreadPool pool(1);
  std::vector<float> got(20);
  const absl::Status st = ScoreExpectedAttention(
      MakeLayer(pb), Params("expected_attention", {{"query_stats", ParamValue::Text("model")}}),
      *model, pool, got.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("registered without statistics"), std::string::npos) << st;
  EXPECT_EQ(st.message().find("settings."), std::string::npos) << st;  // no request field
}

}  // namespace
}  // namespace kvtrim
