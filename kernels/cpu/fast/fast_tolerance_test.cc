// Fast vs exact numerics on the CPU backend (design.md "Numerics", docs/numerics.md "Fast
// numerics on the CPU"), through PolicyEngine, for every policy (every scorer has a fast CPU
// path: the presets and every SCORER+ALLOCATOR composition the registry accepts; the
// model-aware scorers and the lukv compositions get a random test model, with a profile for
// the policy's scorer under lukv) in f32, f16 and bf16, n in {1, 7, 99, 1000} (and 5000 at
// d = 128, 99 at d = 320; G = 4), d in {64, 72, 128}, G in {1, 4}, H_kv = 3, w = min(32, n),
// hidden D = 64, every output shape (at n = 99):
//   * the scores: |fast - exact| <= tau * (|exact| + s), s = the head's score scale (and
//     CriticalKV's stage-2 array the same way);
//   * the tolerance rule: a fast kept list differs from the exact one only in tokens whose
//     exact score lies within tau * (|b| + s) of the list's boundary b (tests/gpu/parity_rule.h,
//     ToleranceBand, tau = 2^-11); protected tokens never differ; CriticalKV's band lies on
//     its stage-2 ranking or its stage-1 boundary (tests/testing/criticalkv_ranking.h), LaProx's
//     layer and model top-K may move counts between heads;
//   * the swap rate (kept tokens that differ / kept tokens), printed per policy, below 1e-3;
//   * determinism: 1, 2 and 7 threads give identical offsets and indices;
//   * the SIMD paths: the best the CPU has, AVX2 at most, and Highway's scalar code, each
//     within the band and deterministic (the forced paths on a smaller grid), and the
//     two-pass path of layers past 64K tokens forced on small ones;
//   * every fast decision says it was computed fast, every exact one exact.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <iterator>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/fast_test_data.h"
#include "base/dtype.h"
#include "kernels/engine.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"
#include "tests/testing/criticalkv_ranking.h"
#include "tests/gpu/parity_rule.h"

namespace kvtrim {
namespace {

using gpu::testing::CaseSpec;
using gpu::testing::CompareDecisions;
using gpu::testing::CpuScores;
using kvtrim::testing::CriticalKVRanking;
using kvtrim::testing::CriticalKVStage1Band;
using gpu::testing::FastScoreCheckedTokens;
using gpu::testing::FastTau;
using gpu::testing::HeadScales;
using gpu::testing::Outcome;
using gpu::testing::ToleranceBand;

constexpr int64_t kKvHeads = 3;
constexpr int64_t kMaxWindow = 32;
constexpr int32_t kHidden = 64;   // D of the test models
constexpr int32_t kNumLayers = 2;
constexpr double kMaxSwapRate = 1e-3;  // design.md, random normal inputs

/// The builtin policies (fast_test_data.h).
const PolicyRegistry& Registry() { return FastTestRegistry(); }

/// Every policy: presets, then SCORER+ALLOCATOR pairs no preset names (every scorer has a
/// fast CPU path).
std::vector<std::string> FastPolicies() {
  std::vector<std::string> out;
  std::set<std::pair<std::string, std::string>> named;
  for (const PolicyPreset& preset : Registry().presets()) {
    out.push_back(preset.name);
    named.insert({preset.scorer, preset.allocator});
  }
  for (const ScorerSpec* scorer : Registry().scorers()) {
    for (const AllocatorSpec* allocator : Registry().allocators()) {
      if (named.count({scorer->name, allocator->name}) == 0) {
        out.push_back(absl::StrCat(scorer->name, "+", allocator->name));
      }
    }
  }
  return out;
}

/// A random test model (query statistics; a profile of `profile_metric` with the given
/// protection when not empty) for H_kv = kKvHeads, G, d, D = kHidden, built once per key.
std::shared_ptr<const RegisteredModel> TestModel(int64_t group, int64_t d,
                                                 const std::string& profile_metric,
                                                 const Protection& profile_protection) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::shared_ptr<const RegisteredModel>>();
  const std::string key = absl::StrCat(group, "/", d, "/", profile_metric, "/",
                                       profile_protection.sink, "/", profile_protection.recent);
  std::lock_guard<std::mutex> lock(mu);
  auto& model = (*cache)[key];
  if (model == nullptr) {
    RandomModelOptions o = FastTestModelOptions(kKvHeads, group, d, kHidden, kNumLayers);
    if (!profile_metric.empty()) {
      o.profile_metric = profile_metric;
      o.profile_sink = profile_protection.sink;
      o.profile_window = profile_protection.recent;
    }
    model = RandomModel(o);
  }
  return model;
}

/// Attaches a test model to `policy` where it needs one: a model-aware scorer, or the lukv
/// allocator (a profile of the policy's scorer, built with the protection it asks for).
absl::Status AttachTestModel(const PolicyEngine& engine, int64_t group, int64_t d,
                             ResolvedPolicy* policy) {
  const bool lukv = policy->allocator->kind == AllocatorKind::kLukv;
  if (!lukv && !IsModelScorer(policy->scorer->kind)) return absl::OkStatus();
  const Protection protection =
      lukv ? policy->scorer->default_protection(policy->params, 0) : Protection{};
  return engine.AttachModel(
      policy, TestModel(group, d, lukv ? policy->scorer->name : "", protection), "settings");
}

/// `settings` prepared with their "window" set to `window`, or as they are when the policy
/// has no such parameter; an error when the registry refuses them either way.
absl::StatusOr<ResolvedPolicy> PrepareWithWindow(const PolicyEngine& engine,
                                                 CompressionSettings settings, int64_t window) {
  settings.params["window"] = ParamValue::Number(static_cast<double>(window));
  auto prepared = engine.Prepare(settings, "settings");
  if (prepared.ok()) return prepared;
  settings.params.clear();  // a parameter the policy lacks
  return engine.Prepare(settings, "settings");
}

/// True when the policy's top-K spans heads (counts may move between heads).
bool MovableCounts(const ResolvedPolicy& policy) {
  if (policy.scorer->kind != ScorerKind::kLaProx) return false;
  return policy.params.Text("mode") != "local" &&
         policy.settings.output_shape != OutputShape::kEqualCount;
}

/// Random normal tensors of one layer in `dtype` (keys, values [H_kv, n, d], queries
/// [H_kv * G, w, d]), as raw bytes.
struct LayerData {
  std::vector<uint8_t> keys, values, queries;
};

/// One case: a policy in one dtype, size and output shape.
struct FastCase {
  std::string policy;
  OutputShape shape = OutputShape::kPerHead;
  DType dtype = DType::kF32;
  int64_t n = 0, d = 0, group = 0;
  int64_t window() const { return std::min(kMaxWindow, n); }
  CaseSpec Spec() const { return {policy, shape, dtype, kKvHeads, n, d, group, window()}; }
};

/// What one case found.
struct CaseResult {
  bool skipped = false;
  std::string failure;
  int64_t kept = 0, swapped = 0;
};

/// Runs one case on backends of 1, 2 and 7 threads: exact on one, fast on each.
CaseResult RunCase(const FastCase& c, const LayerData& data) {
  CaseResult result;
  CompressionSettings settings;
  settings.policy = c.policy;
  settings.output_shape = c.shape;
  settings.block_size = 16;
  settings.budget.keep_fraction = 0.3;
  settings.num_layers = kNumLayers;
  CpuBackend one(1), two(2), seven(7);
  PolicyEngine exact_engine(Registry(), two);
  // The window lowered to the rows sent (SnapKV's default window is 32).
  auto probe = Registry().Resolve(settings, "settings");
  if (probe.ok() && probe->params.Has("window") && probe->params.Int("window") > c.window()) {
    settings.params["window"] = ParamValue::Number(static_cast<double>(c.window()));
  }
  settings.numerics = Numerics::kExact;
  auto exact_policy = exact_engine.Prepare(settings, "settings");
  settings.numerics = Numerics::kFast;
  auto fast_policy = exact_engine.Prepare(settings, "settings");
  if (!exact_policy.ok() || !fast_policy.ok()) {
    result.skipped = true;  // a refused shape
    return result;
  }
  for (ResolvedPolicy* policy : {&*exact_policy, &*fast_policy}) {
    if (absl::Status st = AttachTestModel(exact_engine, c.group, c.d, policy); !st.ok()) {
      result.failure = absl::StrCat(c.Spec().Describe(), ": model: ", st.ToString());
      return result;
    }
  }
  LayerRequest layer;
  layer.layer_id = 1;
  layer.keys = {data.keys.data(), c.dtype, {kKvHeads, c.n, c.d}};
  layer.values = {data.values.data(), c.dtype, {kKvHeads, c.n, c.d}};
  layer.queries = {data.queries.data(), c.dtype, {kKvHeads * c.group, c.window(), c.d}};
  auto exact = exact_engine.CompressLayer(*exact_policy, layer, "layer");
  if (!exact.ok()) {
    result.failure = absl::StrCat(c.Spec().Describe(), ": exact: ", exact.status().ToString());
    return result;
  }
  if (exact->numerics != Numerics::kExact) {
    result.failure = absl::StrCat(c.Spec().Describe(), ": an exact request answered as fast");
    return result;
  }
  std::vector<LayerDecision> fast;
  for (CpuBackend* backend : {&one, &two, &seven}) {
    PolicyEngine engine(Registry(), *backend);
    auto decision = engine.CompressLayer(*fast_policy, layer, "layer");
    if (!decision.ok()) {
      result.failure = absl::StrCat(c.Spec().Describe(), ": fast: ", decision.status().ToString());
      return result;
    }
    if (decision->numerics != Numerics::kFast) {
      result.failure = absl::StrCat(c.Spec().Describe(), ": a fast request answered as exact");
      return result;
    }
    if (!fast.empty() &&
        (decision->offsets != fast[0].offsets || decision->indices != fast[0].indices)) {
      result.failure = absl::StrCat(c.Spec().Describe(),
                                    ": fast indices differ between 1, 2 and 7 threads");
      return result;
    }
    fast.push_back(*std::move(decision));
  }
  for (size_t l = 0; l + 1 < exact->offsets.size() && l + 1 < fast[0].offsets.size(); ++l) {
    result.kept += exact->offsets[l + 1] - exact->offsets[l];
    const std::vector<int32_t> e(exact->indices.begin() + exact->offsets[l],
                                 exact->indices.begin() + exact->offsets[l + 1]);
    const std::vector<int32_t> f(fast[0].indices.begin() + fast[0].offsets[l],
                                 fast[0].indices.begin() + fast[0].offsets[l + 1]);
    std::vector<int32_t> only_fast;
    std::set_difference(f.begin(), f.end(), e.begin(), e.end(), std::back_inserter(only_fast));
    result.swapped += static_cast<int64_t>(only_fast.size());
  }
  auto validated = exact_engine.Validate(*exact_policy, layer, "layer");
  const LayerBudget budget = BudgetFor(*exact_policy, c.n);
  // The exact raw scores (CriticalKV: attention and stage-2), computed once when needed.
  std::optional<LayerScores> raw;
  auto exact_raw = [&]() -> const LayerScores* {
    if (!raw.has_value() && validated.ok()) {
      LayerScores scores;
      scores.layer_id = layer.layer_id;
      scores.num_layers = kNumLayers;
      scores.num_heads = kKvHeads;
      scores.num_tokens = c.n;
      scores.budget = budget;
      if (two.ScoreLayer(*exact_policy, *validated, budget, &scores).ok()) raw = std::move(scores);
    }
    return raw.has_value() ? &*raw : nullptr;
  };
  const bool criticalkv = exact_policy->scorer->kind == ScorerKind::kCriticalKV;
  auto exact_scores = [&]() {
    CpuScores s;
    s.scores.assign(static_cast<size_t>(kKvHeads * c.n), NAN);
    if (validated.ok()) {
      (void)two.ScoreLayer(*exact_policy, CpuLayer::From(*validated), budget, &s.scores);
    }
    if (criticalkv && exact_raw() != nullptr) {
      // CriticalKV selects by its stage-2 ranking: the band lies on it.
      auto ranked = CriticalKVRanking(*exact_policy, *exact_raw());
      if (ranked.ok()) s.scores = *std::move(ranked);
    }
    s.scale = HeadScales(s.scores, kKvHeads, c.n);
    if (exact_policy->params.Has("safeguard_alpha")) {
      s.safeguard = std::min<int64_t>(
          c.n, static_cast<int64_t>(std::floor(exact_policy->params.Number("safeguard_alpha") *
                                               static_cast<double>(budget.kept_per_head))));
    }
    return s;
  };
  const double tau = FastTau(*exact_policy, c.dtype);  // tests/gpu/parity_rule.h
  // The scores themselves: |fast - exact| <= tau * (|exact| + the head's scale).
  if (validated.ok() && c.shape == OutputShape::kPerHead) {
    const CpuLayer cpu = CpuLayer::From(*validated);
    std::vector<float> e, f, e_critical, f_critical;
    Numerics used = Numerics::kExact;
    if (two.ScoreRaw(*exact_policy, cpu, &e, &e_critical).ok() &&
        two.ScoreRawIn(Numerics::kFast, *fast_policy, cpu, &f, &f_critical, &used).ok()) {
      // DropKV's window tokens are ill-conditioned in both modes and protected.
      const int64_t checked = FastScoreCheckedTokens(*fast_policy, c.n);
      for (auto [what, exact_array, fast_array] :
           {std::make_tuple("score", &e, &f),
            std::make_tuple("critical", &e_critical, &f_critical)}) {
        if (exact_array->size() != fast_array->size()) {
          result.failure = absl::StrCat(c.Spec().Describe(), ": ", what, " sizes differ");
          return result;
        }
        if (exact_array->empty()) continue;
        const std::vector<double> scale = HeadScales(*exact_array, kKvHeads, c.n);
        for (int64_t i = 0; i < kKvHeads * c.n; ++i) {
          if (i % c.n >= checked) continue;
          const double ei = (*exact_array)[i], fi = (*fast_array)[i];
          const double bound = tau * (std::fabs(ei) + scale[i / c.n]);
          if (!(std::fabs(fi - ei) <= bound)) {
            result.failure = absl::StrCat(c.Spec().Describe(), ": head ", i / c.n, " token ",
                                          i % c.n, ": fast ", what, " ", fi, ", exact ", ei);
            return result;
          }
        }
      }
    }
  }
  ToleranceBand band;
  band.tau = tau;
  band.movable_counts = MovableCounts(*exact_policy);
  if (criticalkv) {
    // ... or near the stage-1 boundary on the attention scores (a change of stage).
    std::function<bool(int64_t, int32_t)> stage1;
    band.also_near = [&, stage1](int64_t h, int32_t j) mutable {
      if (!stage1 && exact_raw() != nullptr) {
        auto built = CriticalKVStage1Band(*exact_policy, *exact_raw(), band.tau);
        if (built.ok()) stage1 = *std::move(built);
      }
      return stage1 && stage1(h, j);
    };
  }
  const Outcome outcome =
      CompareDecisions(c.Spec(), *exact_policy, *exact, fast[0], exact_scores, false, band);
  result.failure = outcome.failure;
  return result;
}

/// The grid of one run: dtypes, sizes, head dimensions, group sizes.
struct Grid {
  std::vector<DType> dtypes;
  std::vector<int64_t> sizes, dims, groups;
  bool large = false;  // also n = 5000 at d = 128 and n = 99 at d = 320, G = 4
};

/// Runs every case of `grid` on the SIMD paths `limit` allows; returns the cases checked.
int64_t RunAllCases(CpuSimdLimit limit, const Grid& grid) {
  SetCpuSimdLimitForTest(limit);
  std::printf("fast CPU kernels on %s\n", FastCpuTarget().c_str());
  const std::vector<std::string> policies = FastPolicies();
  std::map<std::string, std::pair<int64_t, int64_t>> swaps;  // policy -> kept, swapped
  int64_t checked = 0;
  std::mt19937_64 rng(2024);
  auto run = [&](DType dtype, int64_t n, int64_t d, int64_t group) {
    const int64_t w = std::min(kMaxWindow, n);
    LayerData data{RandomEncoded(dtype, kKvHeads * n * d, 1.0f, rng),
                   RandomEncoded(dtype, kKvHeads * n * d, 1.0f, rng),
                   RandomEncoded(dtype, kKvHeads * group * w * d, 1.0f, rng)};
    for (const std::string& policy : policies) {
      for (OutputShape shape : {OutputShape::kPerHead, OutputShape::kShared,
                                OutputShape::kBlockAligned, OutputShape::kEqualCount}) {
        if (shape != OutputShape::kPerHead && n != 99) continue;
        const FastCase c{policy, shape, dtype, n, d, group};
        const CaseResult r = RunCase(c, data);
        if (r.skipped) continue;
        ++checked;
        EXPECT_EQ(r.failure, "") << c.Spec().Describe();
        swaps[policy].first += r.kept;
        swaps[policy].second += r.swapped;
      }
    }
  };
  for (DType dtype : grid.dtypes) {
    for (int64_t n : grid.sizes) {
      for (int64_t d : grid.dims) {
        for (int64_t group : grid.groups) run(dtype, n, d, group);
      }
    }
    if (grid.large) {
      run(dtype, 5000, 128, 4);
      run(dtype, 99, 320, 4);  // a head wider than the GPU kernels take
    }
  }
  for (const auto& [policy, counts] : swaps) {
    const double rate = counts.first > 0 ? static_cast<double>(counts.second) / counts.first : 0;
    std::printf("  %-22s swap rate %.2e (%lld of %lld kept tokens)\n", policy.c_str(), rate,
                static_cast<long long>(counts.second), static_cast<long long>(counts.first));
    EXPECT_LT(rate, kMaxSwapRate) << policy;
  }
  SetCpuSimdLimitForTest(CpuSimdLimit::kBest);
  return checked;
}

TEST(FastCpuTolerance, EveryFastPolicyWithinTheBandOnTheBestSimd) {
  const Grid grid{{DType::kF32, DType::kF16, DType::kBF16}, {1, 7, 99, 1000}, {64, 72, 128},
                  {1, 4}, /*large=*/true};
  EXPECT_GT(RunAllCases(CpuSimdLimit::kBest, grid), 100);
}

TEST(FastCpuTolerance, Avx2AndScalarPathsWithinTheBand) {
  const Grid grid{{DType::kF32, DType::kBF16}, {7, 99, 1000}, {72, 128}, {4}};
  EXPECT_GT(RunAllCases(CpuSimdLimit::kAvx2, grid), 50);
  EXPECT_GT(RunAllCases(CpuSimdLimit::kScalar, grid), 50);
}

TEST(FastCpuTolerance, TheTwoPassPathOfLongLayersWithinTheBand) {
  // Layers past 64K tokens score in two passes over the key tiles: forced here on small ones.
  SetCpuSlabBytesForTest(0);
  const Grid grid{{DType::kF32, DType::kBF16}, {7, 99, 1000}, {72, 128}, {1, 4}};
  EXPECT_GT(RunAllCases(CpuSimdLimit::kBest, grid), 50);
  SetCpuSlabBytesForTest(int64_t{8} << 20);
}

TEST(FastCpuTolerance, HugeFiniteInputsAnswerOrAreRefusedNamingTheKeys) {
  // Keys, values and queries near fp32's range overflow fp32 dot products in both modes:
  // every fast policy must answer (finite lists) or refuse with INVALID_ARGUMENT naming the
  // keys, never crash, hang or answer NaN statistics.
  constexpr int64_t n = 300, d = 64, group = 4, w = 16;
  std::mt19937_64 rng(77);
  std::vector<float> keys(kKvHeads * n * d), values(keys.size()), queries(kKvHeads * group * w * d);
  std::normal_distribution<float> normal;
  for (auto* t : {&keys, &values, &queries}) {
    for (float& x : *t) x = normal(rng) * 1e19f;
  }
  CpuBackend backend(2);
  PolicyEngine engine(Registry(), backend);
  for (const std::string& policy : FastPolicies()) {
    SCOPED_TRACE(policy);
    CompressionSettings settings;
    settings.policy = policy;
    settings.budget.keep_fraction = 0.3;
    settings.num_layers = 2;
    settings.numerics = Numerics::kFast;
    auto prepared = PrepareWithWindow(engine, settings, 8);
    if (!prepared.ok()) continue;  // a composition the registry refuses
    ASSERT_TRUE(AttachTestModel(engine, group, d, &*prepared).ok());
    LayerRequest layer;
    layer.layer_id = 1;
    layer.keys = {keys.data(), DType::kF32, {kKvHeads, n, d}};
    layer.values = {values.data(), DType::kF32, {kKvHeads, n, d}};
    layer.queries = {queries.data(), DType::kF32, {kKvHeads * group, w, d}};
    auto decision = engine.CompressLayer(*prepared, layer, "layer");
    if (!decision.ok()) {
      EXPECT_EQ(decision.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(decision.status().message()).find("keys"), std::string::npos)
          << decision.status();
      continue;
    }
    for (int32_t j : decision->indices) {
      EXPECT_GE(j, 0);
      EXPECT_LT(j, n);
    }
    for (double p : decision->perturbation) EXPECT_FALSE(std::isnan(p)) << p;
  }
}

// The keys' NaN / Inf check fused into the fast kernels' read (CpuBackend::ChecksKeysFinite):
// for every policy, a NaN, +Inf or -Inf key (f32, f16, bf16; one, or two of which the first
// is named) is refused with exactly the engine's error in exact numerics; the engine leaves
// the keys' scan to the backend only for fast requests over scorers that read every key.
TEST(FastCpuTolerance, NonFiniteKeysAreRefusedWithTheEnginesOwnError) {
  for (const int64_t n : {300, 7}) {  // 7: no longer than the window (nothing to score)
  SCOPED_TRACE(absl::StrCat("n=", n));
  constexpr int64_t d = 64, group = 4;
  const int64_t w = std::min<int64_t>(16, n);
  CpuBackend backend(2);
  PolicyEngine engine(Registry(), backend);
  std::mt19937_64 rng(99);
  const float kBad[] = {NAN, HUGE_VALF, -HUGE_VALF};
  int64_t checked = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::vector<uint8_t> clean_keys = RandomEncoded(dtype, kKvHeads * n * d, 1.0f, rng);
    const std::vector<uint8_t> values = RandomEncoded(dtype, kKvHeads * n * d, 1.0f, rng);
    const std::vector<uint8_t> queries = RandomEncoded(dtype, kKvHeads * group * w * d, 1.0f, rng);
    for (const std::string& policy : FastPolicies()) {
      for (int bad = 0; bad < 3; ++bad) {
        SCOPED_TRACE(absl::StrCat(policy, " ", DTypeName(dtype), " bad=", kBad[bad]));
        // One bad key (head 2, token 257, element 5), or two (the first named).
        std::vector<uint8_t> keys = clean_keys;
        const size_t size = DTypeSize(dtype);
        const auto put = [&](int64_t index, float x) {
          if (dtype == DType::kF32) {
            std::memcpy(keys.data() + 4 * index, &x, 4);
          } else {
            const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
            std::memcpy(keys.data() + size * index, &bits, 2);
          }
        };
        put((2 * n + std::min<int64_t>(257, n - 1)) * d + 5, kBad[bad]);
        if (bad == 1) put((1 * n + 3) * d + 60, NAN);  // earlier: this one is named
        std::string messages[2];
        for (Numerics numerics : {Numerics::kExact, Numerics::kFast}) {
          CompressionSettings settings;
          settings.policy = policy;
          settings.budget.keep_fraction = 0.3;
          settings.num_layers = kNumLayers;
          settings.numerics = numerics;
          auto prepared = PrepareWithWindow(engine, settings, std::min<int64_t>(8, w));
          if (!prepared.ok()) break;  // a composition the registry refuses
          ASSERT_TRUE(AttachTestModel(engine, group, d, &*prepared).ok());
          LayerRequest layer;
          layer.layer_id = 1;
          layer.keys = {keys.data(), dtype, {kKvHeads, n, d}};
          layer.values = {values.data(), dtype, {kKvHeads, n, d}};
          layer.queries = {queries.data(), dtype, {kKvHeads * group, w, d}};
          auto validated = engine.Validate(*prepared, layer, "layer");
          if (validated.ok()) {
            const bool reads_keys = prepared->scorer->name != "streaming_llm" &&
                                    prepared->scorer->name != "random";
            EXPECT_EQ(validated->unchecked_keys_field,
                      numerics == Numerics::kFast && reads_keys ? "layer.keys" : "");
          }
          auto decision = engine.CompressLayer(*prepared, layer, "layer");
          ASSERT_FALSE(decision.ok());
          EXPECT_EQ(decision.status().code(), absl::StatusCode::kInvalidArgument);
          messages[numerics == Numerics::kFast] = std::string(decision.status().message());
        }
        if (messages[0].empty()) continue;  // refused composition
        EXPECT_EQ(messages[1], messages[0]);
        EXPECT_NE(messages[0].find(bad == 1 ? "layer.keys: contains NaN at [1, 3, 60]"
                                            : "layer.keys: contains"),
                  std::string::npos)
            << messages[0];
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
  }
}

TEST(FastCpuTolerance, ForcedPathsAreTheOnesThatRun) {
  SetCpuSimdLimitForTest(CpuSimdLimit::kScalar);
  EXPECT_EQ(FastCpuTarget(), "SCALAR");
  SetCpuSimdLimitForTest(CpuSimdLimit::kAvx2);
  const std::string avx2 = FastCpuTarget();
  SetCpuSimdLimitForTest(CpuSimdLimit::kBest);
  // AVX2 where the CPU has it, never AVX-512 under the limit.
  EXPECT_TRUE(avx2 == "AVX2" || avx2 == "SSE4" || avx2 == "SSSE3" || avx2 == "SCALAR") << avx2;
}

}  // namespace
}  // namespace kvtrim
