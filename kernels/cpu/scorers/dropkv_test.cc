// DropKV scorer conformance (dropkv.md §8) against the fp64 oracle, plus the Lemma 1 and
// Theorem 1 checks of §4.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/scorers.h"
#include "tests/testing/attention_test_layer.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

// The dropkv parameters as registered in kernels/builtin_policies.cc.
std::vector<ParamSpec> DropKVSpecs() {
  return {ParamSpec::Int("window", 8, 1, 4096, "observation window rows"),
          ParamSpec::Int("kernel", 11, 1, 4097, "pooling kernel (odd)"),
          ParamSpec::Enum("pooling", "max", {"max", "avg"}, "pooling operator"),
          ParamSpec::Float("eps", 1e-6, 0, 1, "guard in 1 - p + eps"),
          ParamSpec::Enum("bf16_prob_round", "auto", {"auto", "on", "off"}, "round p to bf16")};
}

ResolvedParams Params(std::map<std::string, ParamValue> overrides) {
  absl::StatusOr<ResolvedParams> p = ResolvedParams::Resolve(DropKVSpecs(), overrides, "params");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

// Parameters of the bare scoring core: one window row, no pooling, fp32 probabilities.
ResolvedParams CoreParams() {
  return Params({{"window", ParamValue::Number(1)},
                 {"kernel", ParamValue::Number(1)},
                 {"bf16_prob_round", ParamValue::Text("off")}});
}

std::vector<float> Score(const CpuLayer& layer, const ResolvedParams& params, int threads = 2) {
  ThreadPool pool(threads);
  std::vector<float> scores(
      static_cast<size_t>(layer.shape.num_kv_heads * layer.shape.num_tokens), -1.0f);
  absl::Status st = ScoreDropKV(layer, params, pool, scores.data());
  EXPECT_TRUE(st.ok()) << st;
  return scores;
}

std::vector<float> Score(const oracle::AttentionProblem& pb, const ResolvedParams& params,
                         int threads = 2) {
  return Score(MakeLayer(pb), params, threads);
}

struct Case {
  int64_t h_kv, group, n, d, w, window, kernel;
};

// §8.2: CPU scores vs the dense GEMM-form and direct fp64 references.
TEST(DropKVTest, MatchesGemmAndDirectOracle) {
  const std::vector<Case> cases = {
      {1, 1, 1, 8, 1, 1, 11},     {1, 4, 7, 16, 7, 7, 3},    {2, 7, 17, 16, 8, 8, 11},
      {2, 1, 99, 8, 8, 8, 11},    {1, 4, 99, 32, 12, 8, 7},  {3, 7, 57, 8, 6, 4, 1},
      {1, 4, 1000, 32, 8, 8, 11},
  };
  uint64_t seed = 400;
  for (const Case& c : cases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    for (bool max_pool : {true, false}) {
      SCOPED_TRACE(testing::Message() << "H_kv=" << c.h_kv << " G=" << c.group << " n=" << c.n
                                      << " d=" << c.d << " w=" << c.w << " window=" << c.window
                                      << " kernel=" << c.kernel << " max=" << max_pool);
      const std::vector<float> got =
          Score(pb, Params({{"window", ParamValue::Number(c.window)},
                            {"kernel", ParamValue::Number(c.kernel)},
                            {"pooling", ParamValue::Text(max_pool ? "max" : "avg")}}));
      oracle::DropKVOptions opt;
      opt.window = c.window;
      opt.kernel = c.kernel;
      opt.max_pool = max_pool;
      const std::vector<double> gemm = oracle::DropKVScoresGemm(pb, opt);
      const std::vector<double> direct = oracle::DropKVScoresDirect(pb, opt);
      const int64_t total = c.h_kv * c.n;
      EXPECT_LT(oracle::MaxRelativeError(got.data(), gemm.data(), total), 1e-4);
      EXPECT_LT(oracle::MaxRelativeError(got.data(), direct.data(), total), 1e-4);
      for (int64_t h = 0; h < c.h_kv; ++h) {
        const int64_t k = std::max<int64_t>(1, c.n / 10);
        EXPECT_EQ(oracle::CompareTopK(got.data() + h * c.n, gemm.data() + h * c.n, c.n, k, 1e-5),
                  "")
            << "head " << h;
      }
    }
  }
}

TEST(DropKVTest, OracleGemmFormEqualsDirectForm) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(41, 2, 4, 64, 16, 8, 2.0);
  oracle::DropKVOptions opt;
  opt.kernel = 1;
  const std::vector<double> gemm = oracle::DropKVScoresGemm(pb, opt);
  const std::vector<double> direct = oracle::DropKVScoresDirect(pb, opt);
  for (size_t j = 0; j < gemm.size(); ++j) {
    EXPECT_NEAR(gemm[j], direct[j], 1e-10 * std::max(1.0, std::abs(direct[j]))) << j;
  }
}

TEST(DropKVTest, DefaultsAreWindow8Kernel11MaxAndFp32ForF32Inputs) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(43, 2, 4, 80, 16, 16, 2.0);
  const std::vector<float> got = Score(pb, Params({}));
  const std::vector<double> want = oracle::DropKVScoresGemm(pb, oracle::DropKVOptions{});
  EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), 2 * 80), 1e-4);
  oracle::DropKVOptions other;
  other.window = 16;
  const std::vector<double> wrong = oracle::DropKVScoresGemm(pb, other);
  EXPECT_GT(oracle::MaxRelativeError(got.data(), wrong.data(), 2 * 80), 1e-2);
}

// bf16 rounding of p: "on" follows the bf16-rounding oracle, "off" the fp32 one, and
// "auto" is on exactly when the keys arrived as bf16.
TEST(DropKVTest, Bf16ProbabilityRounding) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(45, 1, 4, 99, 16, 8, 2.0);
  const int64_t n = 99;
  oracle::DropKVOptions opt;
  opt.kernel = 1;
  const std::vector<double> exact = oracle::DropKVScoresGemm(pb, opt);
  opt.bf16_round = true;
  const std::vector<double> rounded = oracle::DropKVScoresGemm(pb, opt);

  auto with = [](const char* mode) {
    return Params({{"kernel", ParamValue::Number(1)}, {"bf16_prob_round", ParamValue::Text(mode)}});
  };
  const std::vector<float> on = Score(pb, with("on"));
  const std::vector<float> off = Score(pb, with("off"));
  EXPECT_LT(oracle::MaxRelativeError(off.data(), exact.data(), n), 1e-4);
  // The kernel's fp32 p and the oracle's fp64 p may round to neighbouring bf16 values when
  // they straddle a rounding midpoint: allow a few such tokens, bounded by 2 bf16 ulps of p.
  int64_t far = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double rel = std::abs(on[j] - rounded[j]) / rounded[j];
    EXPECT_LT(rel, 2e-2) << j;
    far += rel > 1e-4 ? 1 : 0;
  }
  EXPECT_LE(far, n / 20);
  // Rounding is really applied: most tokens move by more than the fp32 tolerance.
  int64_t moved = 0;
  for (int64_t j = 0; j < n; ++j) moved += std::abs(on[j] - exact[j]) > 1e-4 * exact[j] ? 1 : 0;
  EXPECT_GT(moved, n / 2);

  CpuLayer bf16_layer = MakeLayer(pb);
  bf16_layer.input_dtype = DType::kBF16;
  EXPECT_EQ(Score(bf16_layer, with("auto")), on);
  CpuLayer f16_layer = MakeLayer(pb);
  f16_layer.input_dtype = DType::kF16;
  EXPECT_EQ(Score(f16_layer, with("auto")), off);
  EXPECT_EQ(Score(MakeLayer(pb), with("auto")), off);
}

// A p that rounds to 1.0 in bf16 saturates the weight at eps^-2 (§7.6).
TEST(DropKVTest, Bf16RoundedCertaintySaturatesAtInverseEpsSquared) {
  // n = 3, d = 2, one query; scale 1; logits (0, -10, -10) give p_0 = 1 - 9.1e-5.
  oracle::AttentionProblem pb = oracle::RandomProblem(47, 1, 1, 3, 2, 1, 1.0);
  pb.scale = 1.0;
  pb.queries = {1.0f, 0.0f};
  pb.keys = {0.0f, 0.0f, -10.0f, 0.0f, -10.0f, 0.0f};
  // v_0 = 0 keeps delta^2 = ||a||^2 free of cancellation; a = p_1 v_1 + p_2 v_2.
  pb.values = {0.0f, 0.0f, 1000.0f, 0.0f, 0.0f, 1000.0f};
  const ResolvedParams on = Params({{"window", ParamValue::Number(1)},
                                    {"kernel", ParamValue::Number(1)},
                                    {"bf16_prob_round", ParamValue::Text("on")}});
  const std::vector<float> got = Score(pb, on);
  oracle::DropKVOptions opt;
  opt.window = 1;
  opt.kernel = 1;
  const std::vector<double> unrounded = oracle::DropKVScoresDirect(pb, opt);
  const std::vector<double> a = oracle::OutputMatrix(pb, 0);
  const double delta2 = a[0] * a[0] + a[1] * a[1];
  const double eps = static_cast<double>(1e-6f);
  EXPECT_NEAR(got[0], delta2 / (eps * eps), 1e-3 * delta2 / (eps * eps));
  EXPECT_GT(got[0], 100.0 * unrounded[0]);  // without rounding the weight is ~1e8, not 1e12
}

// §8.3: token n - w + t' gets contributions only from window rows t >= t'.
TEST(DropKVTest, CausalWindow) {
  const int64_t n = 30, w = 8, d = 8, group = 4;
  const oracle::AttentionProblem pb = oracle::RandomProblem(49, 1, group, n, d, w, 2.0);
  const ResolvedParams params = Params({{"kernel", ParamValue::Number(1)}});
  const std::vector<float> base = Score(pb, params);
  for (int64_t tp = 1; tp < w; ++tp) {
    oracle::AttentionProblem changed = pb;  // re-draw rows t < t' of every query head
    std::mt19937_64 rng(1000 + tp);
    std::normal_distribution<double> normal(0, 2);
    for (int64_t q = 0; q < group; ++q) {
      for (int64_t t = 0; t < tp; ++t) {
        for (int64_t i = 0; i < d; ++i) changed.queries[(q * w + t) * d + i] = normal(rng);
      }
    }
    const std::vector<float> got = Score(changed, params);
    for (int64_t j = n - w + tp; j < n; ++j) {
      EXPECT_EQ(got[j], base[j]) << "t'=" << tp << " token " << j;
    }
    EXPECT_NE(got[n - w + tp - 1], base[n - w + tp - 1]) << "t'=" << tp;
  }
  // Every window size against the oracle's explicit causal mask.
  for (int64_t window = 1; window <= w; ++window) {
    oracle::DropKVOptions opt;
    opt.window = window;
    opt.kernel = 1;
    const std::vector<double> want = oracle::DropKVScoresDirect(pb, opt);
    const std::vector<float> got = Score(
        pb, Params({{"window", ParamValue::Number(window)}, {"kernel", ParamValue::Number(1)}}));
    EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), n), 1e-4) << window;
  }
}

// §8.5: pooling runs over the whole vector before protection, so a spike on the first
// window token lifts the pooled score of the 5 tokens before the window (kernel 11).
TEST(DropKVTest, PoolingBeforeProtectionLiftsPreWindowTokens) {
  const int64_t n = 60, w = 8, d = 8;
  oracle::AttentionProblem pb = oracle::RandomProblem(51, 1, 1, n, d, w, 0.2);  // near-uniform p
  const int64_t spike = n - w;
  for (int64_t i = 0; i < d; ++i) pb.values[spike * d + i] = 1000.0f;
  const std::vector<float> raw = Score(pb, Params({{"kernel", ParamValue::Number(1)}}));
  const std::vector<float> pooled = Score(pb, Params({}));
  for (int64_t j = 0; j < n; ++j) {
    if (j != spike) {
      ASSERT_LT(raw[j] * 100, raw[spike]) << "not a spike at " << j;
    }
    EXPECT_TRUE(std::isfinite(pooled[j])) << j;
  }
  for (int64_t j = n - w - 5; j < n - w; ++j) EXPECT_EQ(pooled[j], raw[spike]) << j;
  EXPECT_LT(pooled[n - w - 6], raw[spike]);
  EXPECT_LT(pooled[n - w - 6] * 100, raw[spike]);
}

// §4.1 Lemma 1 in fp64: deleting J and renormalising moves the output by
// sum_{i in J} p_i (a - v_i) / (1 - P_J).
TEST(DropKVTest, Lemma1IdentityFp64) {
  std::mt19937_64 rng(53);
  std::normal_distribution<double> normal(0, 1);
  const int64_t n = 50, d = 8;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> keys(n * d), values(n * d), q(d);
    for (auto& x : keys) x = normal(rng);
    for (auto& x : values) x = normal(rng);
    for (auto& x : q) x = 2.0 * normal(rng);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const std::vector<bool> none(n, false);
    const std::vector<double> a = oracle::SingleQueryOutput(keys, values, q, n, d, scale, none);
    // p by its own softmax.
    std::vector<double> p(n);
    double z = 0;
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += q[i] * keys[j * d + i];
      p[j] = std::exp(scale * dot);
      z += p[j];
    }
    for (auto& x : p) x /= z;
    std::vector<bool> excluded(n, false);
    const int64_t size = 1 + trial % 25;
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t i = 0; i < size; ++i) excluded[order[i]] = true;
    const std::vector<double> a_minus = oracle::SingleQueryOutput(keys, values, q, n, d, scale, excluded);
    double mass = 0;
    std::vector<double> num(d, 0.0);
    for (int64_t j = 0; j < n; ++j) {
      if (!excluded[j]) continue;
      mass += p[j];
      for (int64_t i = 0; i < d; ++i) num[i] += p[j] * (a[i] - values[j * d + i]);
    }
    for (int64_t i = 0; i < d; ++i) {
      EXPECT_NEAR(a_minus[i] - a[i], num[i] / (1.0 - mass), 1e-10) << "trial " << trial;
    }
  }
}

// Lemma 1 for single tokens, through the kernel: with one window row, no pooling and fp32
// probabilities, score_j = ||a_{-j} - a||^2 (up to eps).
TEST(DropKVTest, CoreScoreIsSquaredSingleTokenPerturbation) {
  const int64_t n = 40, d = 16;
  const oracle::AttentionProblem pb = oracle::RandomProblem(55, 1, 1, n, d, 1, 2.0);
  const std::vector<float> got = Score(pb, CoreParams());
  std::vector<double> keys(pb.keys.begin(), pb.keys.end());
  std::vector<double> values(pb.values.begin(), pb.values.end());
  std::vector<double> q(pb.queries.begin(), pb.queries.end());
  const std::vector<bool> none(n, false);
  const std::vector<double> a = oracle::SingleQueryOutput(keys, values, q, n, d, pb.scale, none);
  for (int64_t j = 0; j < n; ++j) {
    std::vector<bool> excluded(n, false);
    excluded[j] = true;
    const std::vector<double> a_minus =
        oracle::SingleQueryOutput(keys, values, q, n, d, pb.scale, excluded);
    double shift = 0;
    for (int64_t i = 0; i < d; ++i) shift += (a_minus[i] - a[i]) * (a_minus[i] - a[i]);
    EXPECT_NEAR(got[j], shift, 1e-4 * shift) << j;
  }
}

// §8.7: n = 3, one query, v_2 = (p_1 v_1 + p_3 v_3) / (1 - p_2) so that a = v_2. Then
// score_2 = 0 and token 2 is evicted first, while AnDPro's p<a, v> would keep it.
TEST(DropKVTest, TinyHandCaseEvictsTheTokenEqualToTheOutput) {
  oracle::AttentionProblem pb = oracle::RandomProblem(57, 1, 1, 3, 2, 1, 1.0);
  const double p[3] = {0.2, 0.5, 0.3};
  pb.scale = 1.0;
  pb.queries = {1.0f, 0.0f};
  pb.keys = {static_cast<float>(std::log(p[0])), 0.0f, static_cast<float>(std::log(p[1])), 0.0f,
             static_cast<float>(std::log(p[2])), 0.0f};
  pb.values = {1.0f, 0.0f, 0.4f, 0.6f, 0.0f, 1.0f};  // v_2 = (0.2 v_1 + 0.3 v_3) / 0.5
  const std::vector<float> got = Score(pb, CoreParams());
  // Hand values: (0.2/0.8)^2 * 0.72 = 0.045 and (0.3/0.7)^2 * 0.32 = 0.0587755.
  EXPECT_NEAR(got[0], 0.045, 1e-5);
  EXPECT_NEAR(got[2], 0.32 * 9.0 / 49.0, 1e-5);
  EXPECT_LT(got[1], 1e-5);
  EXPECT_GE(got[1], 0.0f);
  EXPECT_EQ(std::min_element(got.begin(), got.end()) - got.begin(), 1);
  // AnDPro would rank token 2 first: p<a, v> = (0.08, 0.26, 0.18).
  const std::vector<double> a = oracle::OutputMatrix(pb, 0);
  double andpro[3];
  for (int j = 0; j < 3; ++j) andpro[j] = p[j] * (a[0] * pb.values[2 * j] + a[1] * pb.values[2 * j + 1]);
  EXPECT_GT(andpro[1], andpro[0]);
  EXPECT_GT(andpro[1], andpro[2]);
}

// One synthetic Theorem 1 / 2 instance (§4.3): m pool tokens with residuals r_i = a - v_i
// and small probabilities p_i, plus one heavy last token (the query's own position) that
// carries the remaining mass and makes a = sum_j p_j v_j exact.
struct TheoremInstance {
  int64_t m = 20, d = 8;
  std::vector<double> p;  // [m]
  std::vector<double> r;  // [m, d]
  std::vector<double> u;  // [d] unit cone direction
};

TheoremInstance MakeInstance(uint64_t seed, int64_t d, double noise, int64_t outliers) {
  TheoremInstance in;
  in.d = d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> uniform(0.5, 2.0);
  in.u.resize(d);
  double norm = 0;
  for (auto& x : in.u) {
    x = normal(rng);
    norm += x * x;
  }
  for (auto& x : in.u) x /= std::sqrt(norm);
  in.p.resize(in.m);
  in.r.resize(in.m * d);
  for (int64_t i = 0; i < in.m; ++i) {
    in.p[i] = std::exp(-9.0 + normal(rng));
    const double s = uniform(rng) * (i < outliers ? -1.0 : 1.0);
    for (int64_t c = 0; c < d; ++c) in.r[i * d + c] = s * in.u[c] + noise * normal(rng);
  }
  return in;
}

// Scores the instance with the kernel (one query, no pooling) and returns the proxy's
// eviction set: the k pool tokens with the smallest cost.
std::vector<int64_t> KernelProxySet(const TheoremInstance& in, int64_t k, uint64_t seed) {
  const int64_t n = in.m + 1, d = in.d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> a(d);
  for (auto& x : a) x = normal(rng);
  oracle::AttentionProblem pb = oracle::RandomProblem(seed, 1, 1, n, d, 1, 1.0);
  pb.scale = 1.0;
  std::fill(pb.queries.begin(), pb.queries.end(), 0.0f);
  pb.queries[0] = 1.0f;
  std::fill(pb.keys.begin(), pb.keys.end(), 0.0f);
  double pool_mass = 0;
  std::vector<double> pool_sum(d, 0.0);  // sum_i p_i v_i over the pool
  for (int64_t i = 0; i < in.m; ++i) {
    pool_mass += in.p[i];
    pb.keys[i * d] = static_cast<float>(std::log(in.p[i]));
    for (int64_t c = 0; c < d; ++c) {
      const double v = a[c] - in.r[i * d + c];
      pb.values[i * d + c] = static_cast<float>(v);
      pool_sum[c] += in.p[i] * v;
    }
  }
  const double heavy = 1.0 - pool_mass;
  pb.keys[in.m * d] = static_cast<float>(std::log(heavy));
  for (int64_t c = 0; c < d; ++c) {
    pb.values[in.m * d + c] = static_cast<float>((a[c] - pool_sum[c]) / heavy);
  }
  const std::vector<float> scores = Score(pb, CoreParams());
  std::vector<int64_t> order(in.m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return scores[x] < scores[y]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// The exact proxy in fp64: the k smallest p_i/(1-p_i) ||r_i||.
std::vector<int64_t> ExactProxySet(const TheoremInstance& in, int64_t k) {
  std::vector<double> g(in.m);
  for (int64_t i = 0; i < in.m; ++i) {
    double norm = 0;
    for (int64_t c = 0; c < in.d; ++c) norm += in.r[i * in.d + c] * in.r[i * in.d + c];
    g[i] = in.p[i] / (1.0 - in.p[i]) * std::sqrt(norm);
  }
  std::vector<int64_t> order(in.m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return g[x] < g[y]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// u^T r_i / ||r_i|| for every pool token.
std::vector<double> ConeCosines(const TheoremInstance& in) {
  std::vector<double> cos(in.m);
  for (int64_t i = 0; i < in.m; ++i) {
    double dot = 0, norm = 0;
    for (int64_t c = 0; c < in.d; ++c) {
      dot += in.u[c] * in.r[i * in.d + c];
      norm += in.r[i * in.d + c] * in.r[i * in.d + c];
    }
    cos[i] = dot / std::sqrt(norm);
  }
  return cos;
}

// §4.3 / §8.6: F(J_hat) <= F(J*) / (c (1 - eps)(1 - k eps)) with J* by brute force over
// all C(20, k) subsets and J_hat from the kernel's scores.
TEST(DropKVTest, Theorem1BoundHoldsByBruteForce) {
  int64_t checked = 0;
  for (int64_t k : {10, 18}) {
    for (uint64_t trial = 0; trial < (k == 10 ? 5u : 3u); ++trial) {
      const int64_t d = trial % 2 == 0 ? 8 : 32;
      const TheoremInstance in = MakeInstance(600 + 10 * k + trial, d, 0.3, 0);
      const std::vector<int64_t> proxy = KernelProxySet(in, k, 700 + trial);
      EXPECT_EQ(proxy, ExactProxySet(in, k)) << "k=" << k << " trial " << trial;
      const double f_hat = oracle::SubsetPerturbation(in.p, in.r, d, proxy);
      const double f_star = oracle::MinSubsetPerturbation(in.p, in.r, in.m, d, k);
      const double eps = *std::max_element(in.p.begin(), in.p.end());
      const std::vector<double> cos = ConeCosines(in);
      const double c = *std::min_element(cos.begin(), cos.end());
      ASSERT_GT(f_star, 0.0);
      EXPECT_GE(f_hat, f_star * (1 - 1e-12));
      if (c > 0 && 1 - k * eps > 0) {
        ++checked;
        const double bound = 1.0 / (c * (1 - eps) * (1 - k * eps));
        EXPECT_LE(f_hat / f_star, bound) << "k=" << k << " trial " << trial << " c=" << c;
      }
    }
  }
  EXPECT_GE(checked, 6);  // the cone condition held in most trials: the check is not vacuous
}

// Theorem 2 (§4.3): with outliers outside the cone of width c, F(J_hat) <=
// (F(J*) + (1 + c) mu) / (c (1 - eps)(1 - k eps)), mu = sum over outliers of p_i ||r_i||.
TEST(DropKVTest, Theorem2BoundHoldsWithOutliers) {
  const double c = 0.1;
  for (uint64_t trial = 0; trial < 3; ++trial) {
    const int64_t k = 10, d = 8;
    const TheoremInstance in = MakeInstance(800 + trial, d, 0.3, 3);
    const std::vector<int64_t> proxy = KernelProxySet(in, k, 900 + trial);
    const double f_hat = oracle::SubsetPerturbation(in.p, in.r, d, proxy);
    const double f_star = oracle::MinSubsetPerturbation(in.p, in.r, in.m, d, k);
    const double eps = *std::max_element(in.p.begin(), in.p.end());
    const std::vector<double> cos = ConeCosines(in);
    double mu = 0;
    int64_t outside = 0;
    for (int64_t i = 0; i < in.m; ++i) {
      if (cos[i] >= c) continue;
      ++outside;
      double norm = 0;
      for (int64_t x = 0; x < d; ++x) norm += in.r[i * d + x] * in.r[i * d + x];
      mu += in.p[i] * std::sqrt(norm);
    }
    EXPECT_GE(outside, 3) << "the planted outliers are outside the cone";
    ASSERT_GT(1 - k * eps, 0.0);
    EXPECT_LE(f_hat, (f_star + (1 + c) * mu) / (c * (1 - eps) * (1 - k * eps))) << trial;
  }
}

TEST(DropKVTest, DeterministicAcrossThreadCounts) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(59, 6, 4, 150, 16, 8, 2.0);
  const ResolvedParams params = Params({{"bf16_prob_round", ParamValue::Text("on")}});
  EXPECT_EQ(Score(pb, params, 1), Score(pb, params, 4));
}

}  // namespace
}  // namespace kvtrim
