// Fast vs exact raw scores of the model-aware scorers on the CPU backend (scorers.h,
// ScoreCriticalKVFast / ScoreLaProxFast / ScoreExpectedAttentionFast) for every parameter
// variant the fast kernels branch on: CriticalKV l1 and l2 (attention and stage-2 arrays),
// LaProx gqa mean, head_bound (max pooling) and summed_wo, Expected Attention with the
// model's and the window's query statistics, with and without ||v||:
//   * the band of docs/numerics.md on the scores themselves: |fast - exact| <= tau * (|exact|
//     + scale_h), tau = 2^-11, scale_h = the head's largest finite |exact| (per array);
//   * f32 / f16 / bf16, n in {1, 7, 99, 1000}, d in {64, 72, 128}, G in {1, 4, 8}, D = 64;
//   * the window reductions over every segment layout (FastWindowColumns): windows T in
//     {1, 3, 5, 7, 32, 64, 130} and G in {1, 2, 3, 7, 20, 40} (a query head's rows within a
//     block, across blocks, several heads per block; G > 32 for the group sum);
//   * CriticalKV l1 at D in {520, 4096} (a partial column block, a real o_proj);
//   * determinism: 1, 2 and 7 threads give the same bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/fast/fast_test_data.h"
#include "base/dtype.h"
#include "kernels/engine.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"
#include "tests/gpu/parity_rule.h"

namespace kvtrim {
namespace {

using gpu::testing::HeadScales;

constexpr int64_t kKvHeads = 3;
constexpr double kTau = 1.0 / 2048.0;  // docs/numerics.md, "Tolerance rule"

ParamValue Text(const char* v) { return ParamValue::Text(v); }
ParamValue Flag(bool v) { return ParamValue::Number(v ? 1 : 0); }

/// The builtin policies (fast_test_data.h).
const PolicyRegistry& Registry() { return FastTestRegistry(); }

/// A model-aware scorer configuration.
struct ModelSpec {
  std::string label;
  std::string policy;
  std::map<std::string, ParamValue> params;
};

/// Every branch of the fast model-aware scorers.
std::vector<ModelSpec> Specs() {
  return {
      {"criticalkv_l1", "criticalkv", {{"norm", Text("l1")}}},
      {"criticalkv_l2", "criticalkv", {{"norm", Text("l2")}}},
      {"laprox_mean", "laprox", {{"gqa", Text("mean")}, {"mode", Text("local")}}},
      {"laprox_head_bound",
       "laprox",
       {{"gqa", Text("head_bound")}, {"pooling", Text("max")}, {"mode", Text("local")}}},
      {"laprox_summed_wo", "laprox", {{"gqa", Text("summed_wo")}, {"mode", Text("local")}}},
      {"ea_model", "expected_attention", {{"query_stats", Text("model")}}},
      {"ea_window_no_vnorm",
       "expected_attention",
       {{"query_stats", Text("window")}, {"use_vnorm", Flag(false)}}},
  };
}

/// One case: a configuration at (dtype, n, d, G, D), `rows` window rows sent (w) and the
/// scorer's window lowered to `window` (when it has one).
struct ModelCase {
  ModelSpec spec;
  DType dtype = DType::kF32;
  int64_t n = 0, d = 64, group = 1, hidden = 64, rows = 32, window = 32;
  std::string Describe() const {
    return absl::StrCat(spec.label, " dtype=", DTypeName(dtype), " n=", n, " d=", d,
                        " G=", group, " D=", hidden, " w=", rows, " window=", window);
  }
};

/// Random N(0, 1) tensors of one case in its dtype (queries N(0, 1.5^2)), as raw bytes.
struct CaseData {
  std::vector<uint8_t> keys, values, queries;
};

/// The scores of one mode: scores and (CriticalKV) critical, each [H_kv, n].
struct Raw {
  std::vector<float> scores, critical;
  Numerics used = Numerics::kExact;
};

/// What one case found.
struct Measured {
  std::string failure;
  double scores = 0, critical = 0;  // largest relative errors
};

/// Max |f - e| / (|e| + scale_h) over [H_kv, n] arrays into *error; a failure text when
/// sizes or non-finite values differ.
std::string RelativeError(const char* what, const std::vector<float>& exact,
                          const std::vector<float>& fast, int64_t n, double* error) {
  if (exact.size() != fast.size()) {
    return absl::StrCat(what, ": ", exact.size(), " exact values, ", fast.size(), " fast");
  }
  if (exact.empty()) return "";
  const std::vector<double> scale = HeadScales(exact, kKvHeads, n);
  for (int64_t i = 0; i < static_cast<int64_t>(exact.size()); ++i) {
    const double e = exact[i], f = fast[i];
    if (!std::isfinite(e) || !std::isfinite(f)) {
      if (e != f) return absl::StrCat(what, " head ", i / n, " token ", i % n, ": ", e, " vs ", f);
      continue;
    }
    *error = std::max(*error, std::fabs(f - e) / (std::fabs(e) + scale[i / n]));
  }
  return "";
}

/// Scores one case exact (two threads) and fast (1, 2 and 7 threads), compares them.
Measured Compare(const ModelCase& c) {
  Measured m;
  CompressionSettings settings;
  settings.policy = c.spec.policy;
  settings.params = c.spec.params;
  settings.budget.keep_fraction = 0.3;
  settings.num_layers = 2;
  if (Registry().Resolve(settings, "settings")->params.Has("window")) {
    settings.params["window"] = ParamValue::Number(static_cast<double>(c.window));
  }
  CpuBackend one(1), two(2), seven(7);
  PolicyEngine engine(Registry(), two);
  auto policy = engine.Prepare(settings, "settings");
  if (!policy.ok()) {
    m.failure = absl::StrCat(c.Describe(), ": ", policy.status().ToString());
    return m;
  }
  const RandomModelOptions o = FastTestModelOptions(kKvHeads, c.group, c.d, c.hidden, 2);
  if (absl::Status st = engine.AttachModel(&*policy, RandomModel(o), "settings"); !st.ok()) {
    m.failure = absl::StrCat(c.Describe(), ": ", st.ToString());
    return m;
  }
  std::mt19937_64 rng(static_cast<uint64_t>(c.n * 7919 + c.d * 31 + c.group * 3 + c.rows));
  const CaseData data{RandomEncoded(c.dtype, kKvHeads * c.n * c.d, 1.0f, rng),
                      RandomEncoded(c.dtype, kKvHeads * c.n * c.d, 1.0f, rng),
                      RandomEncoded(c.dtype, kKvHeads * c.group * c.rows * c.d, 1.5f, rng)};
  LayerRequest request;
  request.layer_id = 1;
  request.keys = {data.keys.data(), c.dtype, {kKvHeads, c.n, c.d}};
  request.values = {data.values.data(), c.dtype, {kKvHeads, c.n, c.d}};
  if (c.rows > 0) {  // rows 0: no queries sent (optional for the model's statistics)
    request.queries = {data.queries.data(), c.dtype, {kKvHeads * c.group, c.rows, c.d}};
  }
  auto validated = engine.Validate(*policy, request, "layer");
  if (!validated.ok()) {
    m.failure = absl::StrCat(c.Describe(), ": ", validated.status().ToString());
    return m;
  }
  const CpuLayer exact_layer = CpuLayer::From(*validated);
  const CpuLayer fast_layer = CpuLayer::From(*validated, /*widen_keys_values=*/false);
  Raw exact;
  absl::Status st = two.ScoreRawIn(Numerics::kExact, *policy, exact_layer, &exact.scores,
                                   &exact.critical, &exact.used);
  std::vector<Raw> fast(3);
  CpuBackend* backends[] = {&one, &two, &seven};
  for (size_t i = 0; st.ok() && i < fast.size(); ++i) {
    st = backends[i]->ScoreRawIn(Numerics::kFast, *policy, fast_layer, &fast[i].scores,
                                 &fast[i].critical, &fast[i].used);
  }
  if (!st.ok()) {
    m.failure = absl::StrCat(c.Describe(), ": ", st.ToString());
    return m;
  }
  if (exact.used != Numerics::kExact || fast[0].used != Numerics::kFast) {
    m.failure = absl::StrCat(c.Describe(), ": computed ", NumericsName(exact.used), " / ",
                             NumericsName(fast[0].used));
    return m;
  }
  for (size_t i = 1; i < fast.size(); ++i) {
    if (fast[i].scores != fast[0].scores || fast[i].critical != fast[0].critical) {
      m.failure = absl::StrCat(c.Describe(), ": fast scores differ between 1, 2 and 7 threads");
      return m;
    }
  }
  std::string failure = RelativeError("scores", exact.scores, fast[0].scores, c.n, &m.scores);
  if (failure.empty()) {
    failure = RelativeError("critical", exact.critical, fast[0].critical, c.n, &m.critical);
  }
  if (!failure.empty()) m.failure = absl::StrCat(c.Describe(), ": ", failure);
  return m;
}

/// Runs `cases`, prints each case's errors and expects the band.
void ExpectWithinBand(const std::vector<ModelCase>& cases) {
  double worst = 0;
  for (const ModelCase& c : cases) {
    const Measured m = Compare(c);
    EXPECT_TRUE(m.failure.empty()) << m.failure;
    EXPECT_LE(m.scores, kTau) << c.Describe();
    EXPECT_LE(m.critical, kTau) << c.Describe() << " (critical)";
    worst = std::max({worst, m.scores, m.critical});
  }
  std::printf("[ fast     ] %zu cases, largest relative error %.3g (tau %.3g)\n", cases.size(),
              worst, kTau);
}

TEST(FastCpuModelScores, CloseToExact) {
  std::vector<ModelCase> cases;
  for (const ModelSpec& spec : Specs()) {
    for (int64_t n : {1, 7, 99, 1000}) {
      for (int64_t d : {128, 72, 64}) {
        for (int64_t group : {8, 4, 1}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            const int64_t rows = std::min<int64_t>(32, n);
            cases.push_back({spec, dtype, n, d, group, 64, rows, rows});
          }
        }
      }
    }
  }
  ExpectWithinBand(cases);
}

// The window statistics over every layout of their segments: a query head's rows inside one
// block, spread over several, several heads per block (per-head sums and squares); whole
// window rows per block, one row of G > 32 heads per block (the group sum).
TEST(FastCpuModelScores, ReductionLayouts) {
  struct Layout {
    int64_t group, rows, window;
  };
  const std::vector<Layout> layouts = {{1, 3, 3},   {2, 8, 5},    {3, 32, 32}, {7, 32, 7},
                                       {4, 64, 64}, {1, 130, 130}, {20, 32, 32}, {40, 32, 9},
                                       {3, 4, 1}};
  const std::vector<ModelSpec> all = Specs();
  std::vector<ModelCase> cases;
  for (const ModelSpec& spec : {all[0], all[3], all[2]}) {
    for (const Layout& l : layouts) {
      for (int64_t n : {300, 2000}) {
        for (DType dtype : {DType::kF32, DType::kBF16}) {
          cases.push_back({spec, dtype, n, 64, l.group, 64, l.rows, l.window});
        }
      }
    }
  }
  ExpectWithinBand(cases);
}

// Expected Attention with the model's statistics and no queries sent: H_q comes from the
// statistics (the layer has 0 query heads), in fast as in exact.
TEST(FastCpuModelScores, ExpectedAttentionWithoutQueries) {
  std::vector<ModelCase> cases;
  for (int64_t n : {7, 300}) {
    for (int64_t group : {1, 4}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        cases.push_back({Specs()[5], dtype, n, 64, group, 64, /*rows=*/0, /*window=*/32});
      }
    }
  }
  ExpectWithinBand(cases);
}

// CriticalKV l1 with hidden sizes that end in a partial column block (520) and Llama's
// o_proj (4096).
TEST(FastCpuModelScores, CriticalKVHiddenSizes) {
  std::vector<ModelCase> cases;
  for (int64_t hidden : {520, 4096}) {
    for (int64_t d : {128, 64}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        cases.push_back({Specs().front(), dtype, 300, d, 4, hidden, 32, 32});
      }
    }
  }
  ExpectWithinBand(cases);
}

}  // namespace
}  // namespace kvtrim
