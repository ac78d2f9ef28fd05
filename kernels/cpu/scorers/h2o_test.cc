// H2O scorer vs the dense fp64 oracle (baselines §2).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/scorers.h"
#include "tests/testing/attention_test_layer.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

// The h2o parameters as registered in kernels/builtin_policies.cc.
std::vector<ParamSpec> H2OSpecs() {
  return {ParamSpec::Float("recent_fraction", 0, 0, 1, "share of the budget kept as recent"),
          ParamSpec::Bool("causal_normalize", false, "divide by the rows that see the token")};
}

ResolvedParams Params(bool causal_normalize) {
  absl::StatusOr<ResolvedParams> p = ResolvedParams::Resolve(
      H2OSpecs(), {{"causal_normalize", ParamValue::Number(causal_normalize ? 1 : 0)}}, "params");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

std::vector<float> Score(const oracle::AttentionProblem& pb, bool causal_normalize, int threads = 2) {
  ThreadPool pool(threads);
  std::vector<float> scores(static_cast<size_t>(pb.num_kv_heads * pb.num_tokens), -1.0f);
  absl::Status st = ScoreH2O(MakeLayer(pb), Params(causal_normalize), pool, scores.data());
  EXPECT_TRUE(st.ok()) << st;
  return scores;
}

struct Case {
  int64_t h_kv, group, n, d, w;
};

TEST(H2OTest, MatchesOracle) {
  const std::vector<Case> cases = {{1, 1, 1, 8, 1},   {2, 4, 7, 16, 7},   {1, 7, 99, 8, 20},
                                   {3, 1, 99, 16, 99}, {2, 4, 257, 32, 64},
                                   {1, 4, 6, 8, 9}};  // w > n: rows at negative positions see nothing
  uint64_t seed = 200;
  for (const Case& c : cases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(testing::Message() << "H_kv=" << c.h_kv << " G=" << c.group << " n=" << c.n
                                      << " w=" << c.w << " causal_normalize=" << normalize);
      const std::vector<float> got = Score(pb, normalize);
      const std::vector<double> want = oracle::H2OScores(pb, normalize);
      EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), c.h_kv * c.n), 1e-4);
      for (int64_t h = 0; h < c.h_kv; ++h) {
        const int64_t k = std::max<int64_t>(1, c.n / 4);
        EXPECT_EQ(oracle::CompareTopK(got.data() + h * c.n, want.data() + h * c.n, c.n, k, 1e-5),
                  "")
            << "head " << h;
      }
    }
  }
}

TEST(H2OTest, UniformAttentionHandCase) {
  // Zero queries give uniform attention: row t (position n - w + t) puts 1/(pos + 1) on
  // every visible token. n = 4, w = 3: rows at positions 1, 2, 3.
  oracle::AttentionProblem pb = oracle::RandomProblem(3, 1, 2, 4, 8, 3, 1.0);
  std::fill(pb.queries.begin(), pb.queries.end(), 0.0f);
  const std::vector<float> sum = Score(pb, false);
  const std::vector<float> norm = Score(pb, true);
  const double s0 = 1.0 / 2 + 1.0 / 3 + 1.0 / 4;  // tokens 0 and 1: seen by all 3 rows
  const double s2 = 1.0 / 3 + 1.0 / 4;            // token 2: rows at positions 2, 3
  const double s3 = 1.0 / 4;                      // token 3: only the last row
  const std::vector<double> want_sum = {s0, s0, s2, s3};
  const std::vector<double> want_norm = {s0 / 3, s0 / 3, s2 / 2, s3 / 1};
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(sum[j], want_sum[j], 1e-6) << j;
    EXPECT_NEAR(norm[j], want_norm[j], 1e-6) << j;
  }
}

TEST(H2OTest, CausalNormalizeDividesByRowsThatSeeTheToken) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(21, 1, 4, 60, 16, 10, 2.0);
  const std::vector<float> sum = Score(pb, false);
  const std::vector<float> norm = Score(pb, true);
  for (int64_t j = 0; j < 60; ++j) {
    const int64_t rows = j <= 50 ? 10 : 10 - (j - 50);  // rows with position >= j
    EXPECT_NEAR(norm[j], sum[j] / rows, 1e-6 * sum[j]) << j;
  }
}

TEST(H2OTest, DeterministicAcrossThreadCounts) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(23, 6, 4, 101, 16, 16, 2.0);
  EXPECT_EQ(Score(pb, true, 1), Score(pb, true, 3));
}

}  // namespace
}  // namespace kvtrim
