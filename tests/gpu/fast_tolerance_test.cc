// Fast vs exact numerics on the GPU (design.md "Numerics", docs/numerics.md), through
// PolicyEngine, for every policy ListPolicies lists (the presets and every composition the
// registry accepts; a lukv composition gets a test profile for its scorer), in f32,
// f16 and bf16, n in {1, 7, 99, 1000, 40000}, d in {64, 128}, G in {1, 4, 8}, H_kv = 3,
// w = min(32, n), every output shape the policy takes:
//   * the tolerance rule: a fast kept list differs from the exact one only in tokens whose
//     exact score lies within tau * (|b| + s) of the list's boundary b (s = the head's score
//     scale), counts equal but under adakv / LaProx's layer and model top-K, protected tokens
//     never (tests/gpu/parity_rule.h, ToleranceBand);
//   * the swap rate (kept tokens that differ / kept tokens), printed per case and below 1e-3
//     over each policy's cases (random normal inputs);
//   * determinism: the same fast request twice gives identical offsets and indices;
//   * every decision says which numerics computed it (fast where the policy has a fast path).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/device_pipeline.h"
#include "kernels/registry.h"
#include "tests/gpu/model_test_data.h"
#include "tests/gpu/parity_rule.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/test_device.h"
#include "tests/testing/criticalkv_ranking.h"

namespace kvtrim::gpu::testing {
namespace {

using kvtrim::testing::CriticalKVRanking;
using kvtrim::testing::CriticalKVStage1Band;

constexpr int64_t kKvHeads = 3;
constexpr int64_t kMaxWindow = 32;
constexpr int32_t kLayerId = 1;
constexpr int32_t kNumLayers = 2;
constexpr int32_t kHidden = 64;
constexpr double kKeepFraction = 0.3;
/// The band of docs/numerics.md ("Tolerance rule"), tests/gpu/parity_rule.h.
constexpr double kTau = kFastTau;
/// The swap-rate bound on random normal inputs (design.md).
constexpr double kMaxSwapRate = 1e-3;

/// Every listed policy: the presets, then SCORER+ALLOCATOR for every pair no preset names
/// already (e.g. snapkv+adakv is the preset adakv).
std::vector<std::string> ListedPolicies() {
  std::vector<std::string> out;
  std::set<std::pair<std::string, std::string>> named;
  for (const PolicyPreset& preset : BuiltinRegistry().presets()) {
    out.push_back(preset.name);
    named.insert({preset.scorer, preset.allocator});
  }
  for (const ScorerSpec* scorer : BuiltinRegistry().scorers()) {
    for (const AllocatorSpec* allocator : BuiltinRegistry().allocators()) {
      if (named.count({scorer->name, allocator->name}) != 0) continue;
      out.push_back(absl::StrCat(scorer->name, "+", allocator->name));
    }
  }
  return out;
}

/// One case: a policy in one dtype, size and output shape.
struct FastCase {
  std::string policy;
  OutputShape shape = OutputShape::kPerHead;
  DType dtype = DType::kBF16;
  int64_t n = 0, d = 0, group = 0;
  int64_t window() const { return std::min(kMaxWindow, n); }
  CaseSpec Spec() const {
    return {policy, shape, dtype, kKvHeads, n, d, group, window()};
  }
  std::string Describe() const {
    static const char* kShapes[] = {"per_head", "shared", "block_aligned", "equal_count"};
    return absl::StrCat(Spec().Describe(), " shape=", kShapes[static_cast<int>(shape)]);
  }
};

/// What one case found.
struct CaseResult {
  bool skipped = false;      // the registry or the model refuses this combination
  std::string skip_reason;
  std::string failure;       // empty when every check holds
  int64_t kept = 0;          // kept tokens of the exact decision
  int64_t swapped = 0;       // kept tokens of the fast decision not kept by the exact one
  bool fast = false;         // the fast decision says it was computed fast
};

/// The policy of a case in `mode`, its window lowered to the rows sent and a test model
/// attached when the policy needs one; an error when the combination is refused.
absl::StatusOr<ResolvedPolicy> Prepare(const PolicyEngine& engine, const FastCase& c,
                                       Numerics mode) {
  CompressionSettings settings;
  settings.policy = c.policy;
  settings.output_shape = c.shape;
  settings.block_size = 16;
  settings.budget.by_fraction = true;
  settings.budget.keep_fraction = kKeepFraction;
  settings.num_layers = kNumLayers;
  settings.seed = 5;
  settings.numerics = mode;
  auto policy = PrepareForRows(engine, settings, c.window());
  if (!policy.ok()) return policy.status();
  TestModelKey key;
  key.kv_heads = static_cast<int32_t>(kKvHeads);
  key.group = static_cast<int32_t>(c.group);
  key.head_dim = static_cast<int32_t>(c.d);
  key.hidden = kHidden;
  key.layers = kNumLayers;
  if (policy->allocator->kind == AllocatorKind::kLukv) {
    // A profile for the policy's own scorer, built with the protection it asks for.
    const Protection protection = policy->scorer->default_protection(policy->params, 0);
    key.profile_metric = policy->scorer->name;
    key.profile_sink = protection.sink;
    key.profile_window = protection.recent;
  }
  const absl::Status st = engine.AttachModel(&*policy, TestModel(key), "settings");
  if (!st.ok()) return st;
  return policy;
}

/// The layer tensors of (dtype, n, d, G), generated once and shared by every policy.
std::shared_ptr<const ModelLayerData> CaseData(const FastCase& c) {
  static auto* cache = new OnceCache<std::tuple<int, int64_t, int64_t, int64_t>, ModelLayerData>();
  return cache->Get(std::make_tuple(static_cast<int>(c.dtype), c.n, c.d, c.group), [&] {
    return MakeModelLayerData(c.dtype, kKvHeads, c.n, c.d, c.group, c.window(),
                              static_cast<uint64_t>(c.n * 7919 + c.d * 31 + c.group * 3 + 1));
  });
}

/// The layer request of a case over its tensors (keys, values and queries always sent).
LayerRequest RequestOf(const FastCase& c, const ModelLayerData& data) {
  LayerRequest layer;
  layer.layer_id = kLayerId;
  layer.keys = {data.keys.data(), c.dtype, {kKvHeads, c.n, c.d}};
  layer.values = {data.values.data(), c.dtype, {kKvHeads, c.n, c.d}};
  layer.queries = {data.queries.data(), c.dtype, {kKvHeads * c.group, c.window(), c.d}};
  return layer;
}

/// Kept list `l` of a decision.
std::vector<int32_t> KeptList(const LayerDecision& d, size_t l) {
  return {d.indices.begin() + d.offsets[l], d.indices.begin() + d.offsets[l + 1]};
}

/// True when the policy's top-K spans heads (counts may move between heads).
bool MovableCounts(const ResolvedPolicy& policy) {
  if (policy.scorer->kind != ScorerKind::kLaProx) return false;
  return policy.params.Text("mode") != "local" &&
         policy.settings.output_shape != OutputShape::kEqualCount;
}

/// Runs one case: exact, fast twice; checks the band, determinism and the reported mode.
CaseResult RunCase(const FastCase& c) {
  CaseResult result;
  PolicyEngine engine(BuiltinRegistry(), SharedGpu());
  auto exact_policy = Prepare(engine, c, Numerics::kExact);
  auto fast_policy = Prepare(engine, c, Numerics::kFast);
  if (!exact_policy.ok() || !fast_policy.ok()) {
    result.skipped = true;
    result.skip_reason = (exact_policy.ok() ? fast_policy.status() : exact_policy.status()).ToString();
    return result;
  }
  const std::shared_ptr<const ModelLayerData> held = CaseData(c);
  const LayerRequest layer = RequestOf(c, *held);
  auto exact = engine.CompressLayer(*exact_policy, layer, "layer");
  auto fast = engine.CompressLayer(*fast_policy, layer, "layer");
  auto again = engine.CompressLayer(*fast_policy, layer, "layer");
  if (!exact.ok() || !fast.ok() || !again.ok()) {
    result.failure = absl::StrCat(c.Describe(), ": ", exact.status().ToString(), " / ",
                                  fast.status().ToString(), " / ", again.status().ToString());
    return result;
  }
  if (exact->numerics != Numerics::kExact) {
    result.failure = absl::StrCat(c.Describe(), ": an exact request was answered as fast");
    return result;
  }
  result.fast = fast->numerics == Numerics::kFast;
  const bool expect_fast = HasFastPath(*exact_policy->scorer, c.dtype, c.d);
  if (result.fast != expect_fast) {
    result.failure = absl::StrCat(c.Describe(), ": fast request answered as ",
                                  NumericsName(fast->numerics));
    return result;
  }
  if (fast->offsets != again->offsets || fast->indices != again->indices) {
    result.failure = absl::StrCat(c.Describe(), ": the same fast request gave different indices");
    return result;
  }
  for (size_t l = 0; l + 1 < exact->offsets.size(); ++l) {
    result.kept += exact->offsets[l + 1] - exact->offsets[l];
    if (l + 1 >= fast->offsets.size()) break;
    std::vector<int32_t> only_fast;
    const std::vector<int32_t> e = KeptList(*exact, l);
    const std::vector<int32_t> f = KeptList(*fast, l);
    std::set_difference(f.begin(), f.end(), e.begin(), e.end(), std::back_inserter(only_fast));
    result.swapped += static_cast<int64_t>(only_fast.size());
  }
  auto validated = engine.Validate(*exact_policy, layer, "layer");
  const LayerBudget budget = BudgetFor(*exact_policy, c.n);
  // CriticalKV's exact raw scores (attention and stage-2), computed once, when first needed.
  std::optional<LayerScores> raw;
  auto critical_raw = [&]() -> const LayerScores* {
    if (!raw.has_value() && validated.ok()) {
      LayerScores scores;
      scores.layer_id = kLayerId;
      scores.num_layers = kNumLayers;
      scores.num_heads = kKvHeads;
      scores.num_tokens = c.n;
      scores.budget = budget;
      if (SharedGpu().ScoreLayer(*exact_policy, *validated, budget, &scores).ok()) {
        raw = std::move(scores);
      }
    }
    return raw.has_value() ? &*raw : nullptr;
  };
  auto exact_scores = [&]() {
    CpuScores s;
    if (!validated.ok()) return s;
    if (!SharedGpu().ScoreLayer(*exact_policy, *validated, budget, &s.scores).ok()) {
      s.scores.assign(static_cast<size_t>(kKvHeads * c.n), NAN);
    }
    if (exact_policy->scorer->kind == ScorerKind::kCriticalKV && critical_raw() != nullptr) {
      // CriticalKV selects by its stage-2 ranking: the band lies on it (criticalkv_ranking.h).
      auto ranked = CriticalKVRanking(*exact_policy, *critical_raw());
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
  ToleranceBand band;
  band.tau = FastTau(*exact_policy, c.dtype);
  band.movable_counts = MovableCounts(*exact_policy);
  if (exact_policy->scorer->kind == ScorerKind::kCriticalKV) {
    // ... or near the stage-1 boundary on the attention scores (a change of stage).
    std::function<bool(int64_t, int32_t)> stage1;
    band.also_near = [&, stage1](int64_t h, int32_t j) mutable {
      if (!stage1 && critical_raw() != nullptr) {
        auto built = CriticalKVStage1Band(*exact_policy, *critical_raw(), band.tau);
        if (built.ok()) stage1 = *std::move(built);
      }
      return stage1 && stage1(h, j);
    };
  }
  const Outcome outcome =
      CompareDecisions(c.Spec(), *exact_policy, *exact, *fast, exact_scores, false, band);
  result.failure = outcome.failure;
  return result;
}

/// The largest |fast - exact| / (|exact| + scale_h) over the finite scores of one case
/// (protected scores of GpuBackend::ScoreLayer in each mode), or a failure text; *tau gets
/// the case's band. DropKV's window tokens, and the prefix tokens its whole-length pooling
/// reaches from them, are left out: a window token j can have p near 1, where both modes
/// compute (p / (1 - p + eps))^2 * |a - v_j|^2 with a ~ v_j, a cancellation that neither
/// resolves (those tokens are protected by the policy's own window).
std::string ScoreError(const FastCase& c, double* error, double* tau) {
  PolicyEngine engine(BuiltinRegistry(), SharedGpu());
  auto exact_policy = Prepare(engine, c, Numerics::kExact);
  auto fast_policy = Prepare(engine, c, Numerics::kFast);
  if (!exact_policy.ok() || !fast_policy.ok()) return "refused";
  const std::shared_ptr<const ModelLayerData> held = CaseData(c);
  const LayerRequest layer = RequestOf(c, *held);
  auto validated = engine.Validate(*exact_policy, layer, "layer");
  if (!validated.ok()) return validated.status().ToString();
  LayerBudget budget;
  budget.kept_per_head = KeptCount(exact_policy->settings.budget, c.n);
  std::vector<float> exact, fast;
  absl::Status st = SharedGpu().ScoreLayer(*exact_policy, *validated, budget, &exact);
  if (st.ok()) st = SharedGpu().ScoreLayer(*fast_policy, *validated, budget, &fast);
  if (!st.ok()) return st.ToString();
  const std::vector<double> scale = HeadScales(exact, kKvHeads, c.n);
  *tau = FastTau(*exact_policy, c.dtype);
  const int64_t checked = FastScoreCheckedTokens(*exact_policy, c.n);
  *error = 0;
  for (int64_t h = 0; h < kKvHeads; ++h) {
    for (int64_t j = 0; j < checked; ++j) {
      const double e = exact[h * c.n + j];
      const double f = fast[h * c.n + j];
      if (!std::isfinite(e) || !std::isfinite(f)) {
        if (std::isfinite(e) != std::isfinite(f) || e != f) {
          return absl::StrCat("head ", h, " token ", j, ": exact ", e, " fast ", f);
        }
        continue;
      }
      *error = std::max(*error, std::fabs(f - e) / (std::fabs(e) + scale[h]));
    }
  }
  return "";
}

// The attention scorers' fast scores themselves, before any selection: within tau of the
// exact ones relative to |score| + the head's scale, in every dtype and shape (the first
// thing to read when a decision test fails).
TEST(FastScoresTest, FastScorersCloseToExact) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<FastCase> cases;
  for (const char* policy : {"snapkv", "h2o", "tova", "dropkv", "knorm", "keydiff"}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, int64_t{40000}}) {
      for (int64_t d : {128, 64}) {
        for (int64_t group : {8, 4, 1}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            cases.push_back({policy, OutputShape::kPerHead, dtype, n, d, group});
          }
        }
      }
    }
  }
  struct Measured {
    std::string failure;
    double error = 0, tau = kTau;
  };
  const std::vector<Measured> measured = RunConcurrently(cases, [](const FastCase& c) {
    Measured m;
    m.failure = ScoreError(c, &m.error, &m.tau);
    return m;
  });
  std::vector<double> errors, taus;
  std::vector<std::string> failures;
  for (const Measured& m : measured) {
    errors.push_back(m.error);
    taus.push_back(m.tau);
    failures.push_back(m.failure);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("[ scores   ] %s: max relative error %.3g (tau %.3g)\n",
                cases[i].Describe().c_str(), errors[i], taus[i]);
    EXPECT_TRUE(failures[i].empty()) << cases[i].Describe() << ": " << failures[i];
    EXPECT_LE(errors[i], taus[i]) << cases[i].Describe();
  }
}

// Small shapes of every fast attention kernel variant, one case at a time, for
// compute-sanitizer (memcheck and racecheck run this test; the sweep above is too long).
TEST(FastSanitizer, SmallCases) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (const char* policy : {"snapkv", "h2o", "tova", "dropkv", "knorm", "keydiff"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t group : {1, 8}) {  // narrow and wide row chunks (h2o: 8 x 32 rows)
        const FastCase c{policy, OutputShape::kPerHead, dtype, 99, 64, group};
        double error = 0, tau = 0;
        const std::string failure = ScoreError(c, &error, &tau);
        EXPECT_TRUE(failure.empty()) << c.Describe() << ": " << failure;
        EXPECT_LE(error, tau) << c.Describe();
      }
    }
  }
}

class FastToleranceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FastToleranceTest, WithinBandDeterministicAndLabelled) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<FastCase> cases;
  for (OutputShape shape : {OutputShape::kPerHead, OutputShape::kShared,
                            OutputShape::kBlockAligned, OutputShape::kEqualCount}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, int64_t{40000}}) {
      for (int64_t d : {128, 64}) {
        for (int64_t group : {8, 4, 1}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            cases.push_back({GetParam(), shape, dtype, n, d, group});
          }
        }
      }
    }
  }
  const std::vector<CaseResult> results = RunConcurrently(cases, RunCase);
  int64_t kept = 0, swapped = 0, ran = 0, fast = 0;
  std::string skipped;
  for (size_t i = 0; i < cases.size(); ++i) {
    const CaseResult& r = results[i];
    if (r.skipped) {
      if (skipped.empty()) skipped = r.skip_reason;
      continue;
    }
    ++ran;
    fast += r.fast ? 1 : 0;
    EXPECT_TRUE(r.failure.empty()) << r.failure;
    kept += r.kept;
    swapped += r.swapped;
    std::printf("[ fast     ] %s: swap rate %.3g (%lld of %lld kept)%s\n",
                cases[i].Describe().c_str(), r.kept ? static_cast<double>(r.swapped) / r.kept : 0.0,
                static_cast<long long>(r.swapped), static_cast<long long>(r.kept),
                r.fast ? "" : " [exact: no fast path]");
  }
  const double rate = kept ? static_cast<double>(swapped) / static_cast<double>(kept) : 0.0;
  std::printf("[ fast     ] %s: %lld cases (%lld fast), swap rate %.3g over %lld kept tokens%s%s\n",
              GetParam().c_str(), static_cast<long long>(ran), static_cast<long long>(fast), rate,
              static_cast<long long>(kept), skipped.empty() ? "" : "; skipped: ",
              skipped.c_str());
  EXPECT_LT(rate, kMaxSwapRate) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Policies, FastToleranceTest, ::testing::ValuesIn(ListedPolicies()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return absl::StrReplaceAll(info.param, {{"+", "_with_"}});
                         });

}  // namespace
}  // namespace kvtrim::gpu::testing
