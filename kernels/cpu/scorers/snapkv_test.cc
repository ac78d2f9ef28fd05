// SnapKV scorer vs the dense fp64 oracle (baselines §3).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/attention_test_layer.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/scorers.h"
#include "kernels/engine.h"
#include "kernels/registry.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

// The snapkv parameters as registered in kernels/builtin_policies.cc.
std::vector<ParamSpec> SnapKVSpecs() {
  return {ParamSpec::Int("window", 32, 1, 4096, "observation window rows"),
          ParamSpec::Int("kernel", 7, 1, 4097, "pooling kernel (odd)"),
          ParamSpec::Enum("pooling", "max", {"max", "avg"}, "pooling operator")};
}

ResolvedParams Params(std::map<std::string, ParamValue> overrides) {
  absl::StatusOr<ResolvedParams> p = ResolvedParams::Resolve(SnapKVSpecs(), overrides, "params");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

std::vector<float> Score(const oracle::AttentionProblem& pb, const ResolvedParams& params,
                         int threads = 2) {
  ThreadPool pool(threads);
  std::vector<float> scores(static_cast<size_t>(pb.num_kv_heads * pb.num_tokens), -1.0f);
  absl::Status st = ScoreSnapKV(MakeLayer(pb), params, pool, scores.data());
  EXPECT_TRUE(st.ok()) << st;
  return scores;
}

struct Case {
  int64_t h_kv, group, n, d, w, window, kernel;
};

TEST(SnapKVTest, MatchesOracle) {
  const std::vector<Case> cases = {
      {1, 1, 1, 8, 1, 1, 7},     {2, 4, 7, 16, 3, 3, 3},   {1, 7, 7, 8, 7, 5, 7},
      {2, 1, 99, 16, 8, 8, 11},  {1, 4, 99, 32, 40, 32, 7}, {3, 7, 57, 8, 6, 2, 1},
      {1, 4, 300, 64, 32, 32, 7}, {2, 4, 5, 8, 8, 6, 3},  // w > n (the engine rejects it): rows at negative positions see nothing
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    for (const char* pooling : {"max", "avg"}) {
      SCOPED_TRACE(testing::Message() << "H_kv=" << c.h_kv << " G=" << c.group << " n=" << c.n
                                      << " d=" << c.d << " w=" << c.w << " window=" << c.window
                                      << " kernel=" << c.kernel << " pooling=" << pooling);
      const std::vector<float> got =
          Score(pb, Params({{"window", ParamValue::Number(c.window)},
                            {"kernel", ParamValue::Number(c.kernel)},
                            {"pooling", ParamValue::Text(pooling)}}));
      const std::vector<double> want =
          oracle::SnapKVScores(pb, c.window, c.kernel, std::string(pooling) == "max");
      EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), c.h_kv * c.n), 1e-4);
      for (int64_t h = 0; h < c.h_kv; ++h) {
        const int64_t k = std::max<int64_t>(1, c.n / 3);
        EXPECT_EQ(oracle::CompareTopK(got.data() + h * c.n, want.data() + h * c.n, c.n, k, 1e-5),
                  "")
            << "head " << h;
      }
    }
  }
}

TEST(SnapKVTest, DefaultsAreWindow32Kernel7Max) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(5, 2, 4, 120, 16, 40, 2.0);
  const std::vector<float> got = Score(pb, Params({}));
  const std::vector<double> want = oracle::SnapKVScores(pb, 32, 7, true);
  EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), 2 * 120), 1e-4);
  // A different window gives different scores: the default is really 32.
  const std::vector<double> other = oracle::SnapKVScores(pb, 8, 7, true);
  EXPECT_GT(oracle::MaxRelativeError(got.data(), other.data(), 2 * 120), 1e-2);
}

TEST(SnapKVTest, ReadsOnlyTheLastWindowRows) {
  oracle::AttentionProblem pb = oracle::RandomProblem(9, 1, 4, 50, 8, 12, 2.0);
  const ResolvedParams params = Params({{"window", ParamValue::Number(4)}});
  const std::vector<float> base = Score(pb, params);
  // Rows 0..7 of every query head are outside the window of 4: changing them is a no-op.
  oracle::AttentionProblem outside = pb;
  for (int64_t q = 0; q < 4; ++q) {
    for (int64_t t = 0; t < 8; ++t) {
      for (int64_t i = 0; i < 8; ++i) outside.queries[(q * 12 + t) * 8 + i] *= -3.0f;
    }
  }
  EXPECT_EQ(Score(outside, params), base);
  // Row 8 is the first window row: changing it changes the scores.
  oracle::AttentionProblem inside = pb;
  for (int64_t i = 0; i < 8; ++i) inside.queries[(2 * 12 + 8) * 8 + i] *= -3.0f;
  EXPECT_NE(Score(inside, params), base);
}

TEST(SnapKVTest, WindowTokensHaveFiniteScores) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(11, 2, 1, 40, 8, 32, 1.0);
  for (float s : Score(pb, Params({}))) {
    EXPECT_TRUE(std::isfinite(s));
    EXPECT_GT(s, 0.0f);
  }
}

ResolvedParams Window8() {
  return Params({{"window", ParamValue::Number(8)}, {"kernel", ParamValue::Number(7)}});
}

TEST(SnapKVTest, WindowAttentionNeverReachesThePrefix) {
  const oracle::AttentionProblem pb = oracle::WindowBoundarySpikeProblem();
  const std::vector<float> got = Score(pb, Window8());
  // The last prefix tokens keep the background score: the spike at token 32 is not pooled in.
  for (int j = 26; j < 32; ++j) EXPECT_EQ(got[j], got[0]) << "token " << j;
  EXPECT_LT(got[31], got[15]);
  for (int j = 2; j <= 8; ++j) EXPECT_EQ(got[j], got[5]) << "token " << j;
  for (int j = 12; j <= 18; ++j) EXPECT_EQ(got[j], got[15]) << "token " << j;
  EXPECT_GT(got[5], got[15]);
  EXPECT_GT(got[15], got[0]);
  // The window tokens take the largest pooled prefix score (kvpress pads with the max).
  for (int j = 32; j < 40; ++j) EXPECT_EQ(got[j], got[5]) << "token " << j;
  const std::vector<double> want = oracle::SnapKVScores(pb, 8, 7, true);
  EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), 40), 1e-5);
}

TEST(SnapKVTest, WindowTokensTakeTheBestPrefixScoreOrZeroWithoutAPrefix) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(21, 3, 2, 50, 8, 12, 2.0);
  for (const char* pooling : {"max", "avg"}) {
    const std::vector<float> got = Score(pb, Params({{"window", ParamValue::Number(12)},
                                                     {"pooling", ParamValue::Text(pooling)}}));
    for (int64_t h = 0; h < 3; ++h) {
      const float* row = got.data() + h * 50;
      const float best = *std::max_element(row, row + 38);
      for (int64_t j = 38; j < 50; ++j) EXPECT_EQ(row[j], best) << pooling << " head " << h;
    }
  }
  // n = window: no prefix, every token scores 0.
  const oracle::AttentionProblem all_window = oracle::RandomProblem(22, 2, 1, 12, 8, 12, 2.0);
  EXPECT_EQ(Score(all_window, Params({{"window", ParamValue::Number(12)}})),
            std::vector<float>(24, 0.0f));
}

/// Kept indices of head 0 of `pb` under `settings` on the CPU backend.
std::vector<int32_t> Kept(const oracle::AttentionProblem& pb, const CompressionSettings& settings) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend backend(1);
  PolicyEngine engine(registry, backend);
  auto policy = engine.Prepare(settings, "settings");
  EXPECT_TRUE(policy.ok()) << policy.status();
  if (!policy.ok()) return {};
  LayerRequest layer;
  layer.keys = {pb.keys.data(), DType::kF32, {pb.num_kv_heads, pb.num_tokens, pb.head_dim}};
  layer.values = {pb.values.data(), DType::kF32, {pb.num_kv_heads, pb.num_tokens, pb.head_dim}};
  layer.queries = {pb.queries.data(), DType::kF32,
                   {pb.num_query_heads, pb.window_rows, pb.head_dim}};
  auto decision = engine.CompressLayer(*policy, layer, "layer");
  EXPECT_TRUE(decision.ok()) << decision.status();
  if (!decision.ok()) return {};
  return {decision->indices.begin() + decision->offsets[0],
          decision->indices.begin() + decision->offsets[1]};
}

TEST(SnapKVTest, PrefixOnlyPoolingDecidesTheKeptSet) {
  // keep 15 = the window of 8 + 7 prefix tokens. Prefix-only pooling keeps the 7 tokens
  // around token 5; whole-vector pooling would keep 29, 30, 31 and only 2..5.
  const oracle::AttentionProblem pb = oracle::WindowBoundarySpikeProblem();
  std::vector<int32_t> expected = {2, 3, 4, 5, 6, 7, 8};
  for (int32_t j = 32; j < 40; ++j) expected.push_back(j);
  for (const char* policy : {"snapkv", "adakv", "pyramidkv"}) {
    CompressionSettings s;
    s.policy = policy;
    s.params = {{"window", ParamValue::Number(8)}};
    s.budget.by_fraction = false;
    s.budget.keep_tokens = 15;
    s.num_layers = 1;
    EXPECT_EQ(Kept(pb, s), expected) << policy;
  }
}

TEST(SnapKVTest, UnprotectedWindowTokensRankWithTheBestPrefixTokenAndLoseItsTie) {
  // recent_tokens 2 < window 8: only 38 and 39 are protected. Tokens 32..37 score exactly
  // the best pooled prefix score, tied with 2..8 (lower index first) and above 12..18.
  const oracle::AttentionProblem pb = oracle::WindowBoundarySpikeProblem();
  CompressionSettings s;
  s.policy = "snapkv";
  s.params = {{"window", ParamValue::Number(8)}};
  s.recent_tokens = 2;
  s.budget.by_fraction = false;
  s.budget.keep_tokens = 9;
  EXPECT_EQ(Kept(pb, s), (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8, 38, 39}));
  s.budget.keep_tokens = 12;
  EXPECT_EQ(Kept(pb, s), (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8, 32, 33, 34, 38, 39}));
}

TEST(SnapKVTest, DeterministicAcrossThreadCounts) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(13, 5, 4, 77, 16, 32, 2.0);
  const ResolvedParams params = Params({{"pooling", ParamValue::Text("avg")}});
  EXPECT_EQ(Score(pb, params, 1), Score(pb, params, 4));
}

}  // namespace
}  // namespace kvtrim
