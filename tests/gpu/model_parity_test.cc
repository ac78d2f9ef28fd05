// GPU vs CPU parity of the model-aware policies (issue 4): CriticalKV, LaProx and Expected
// Attention scores bit for bit, and whole decisions (CriticalKV's two stages, AdaKV, LU-KV,
// LaProx per layer, block-aligned and equal-count outputs) list for list.
//
// Scores: GpuBackend::ScoreLayer (raw scores + CriticalKV's critical) against the CPU backend's
// ScoreLayer (the canonical CPU scorers), memcmp of every float, for
//   criticalkv l1 / l2 (max pooling; l1 also avg), laprox gqa mean / head_bound / summed_wo,
//   expected_attention query_stats model / window (use_vnorm on; model also off)
// x f32 / f16 / bf16 x n in {1, 7, 99, 1000, 40000} x d in {64, 128} x G in {1, 4} x hidden D in
// {64, 512} (D = 64 only at n = 40000, where the CPU's o_proj-sized L1 reference would dominate
// the run; D matters only to criticalkv l1), H_kv = 3, w = min(32, n) with the window lowered to
// w. Random models come from tests/testing/random_model_test_util.h (query statistics included).
//
// Decisions: GpuBackend::CompressLayer against CpuBackend::CompressLayer through PolicyEngine
// (AttachModel) for the presets criticalkv, criticalkv_adakv, expected_attention, lukv (snapkv +
// a random snapkv profile), laprox (modes local / layer / model on one layer), compositions
// with pyramid / adakv / shared outputs, and snapkv / adakv with block_aligned and equal_count;
// the rule of tests/gpu/parity_rule.h in exact mode (indices equal, perturbation 1e-9).
// Skips without a GPU.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/registry.h"
#include "tests/gpu/gpu_backend_for_tests.h"
#include "tests/gpu/model_test_data.h"
#include "tests/gpu/parity_rule.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr int64_t kKvHeads = 3;
constexpr int64_t kMaxWindow = 32;
constexpr int32_t kLayerId = 1;
constexpr int32_t kNumLayers = 2;
constexpr double kKeepFraction = 0.3;
constexpr int64_t kLargeN = 40000;

/// One thread per case for small n (cases run in parallel), one per KV head for n = 40000.
CpuBackend& SharedCpu(int64_t n) {
  return testing::SharedCpu(n >= kLargeN, static_cast<int>(kKvHeads));
}

/// A policy with parameter overrides and an output shape.
struct PolicySpec {
  std::string label;   // test-name fragment
  std::string policy;  // preset or composition
  std::map<std::string, ParamValue> params;
  OutputShape shape = OutputShape::kPerHead;
  int32_t block_size = 0;
  bool lukv_profile = false;  // the model carries a snapkv profile matching the window
};

/// One layer case: a policy at (dtype, n, d, G, D).
struct ModelCase {
  PolicySpec spec;
  DType dtype = DType::kF32;
  int64_t n = 0, d = 64, group = 1, hidden = 64;
  int64_t window() const { return std::min(kMaxWindow, n); }
  std::string Describe() const {
    return absl::StrCat(spec.label, " dtype=", DTypeName(dtype), " n=", n, " d=", d, " G=", group,
                        " D=", hidden, " H_kv=", kKvHeads, " w=", window());
  }
};

/// Resolves the case's policy with its window lowered to w and its model attached.
absl::StatusOr<ResolvedPolicy> PreparePolicy(const ModelCase& c, const PolicyEngine& engine) {
  CompressionSettings settings;
  settings.policy = c.spec.policy;
  settings.params = c.spec.params;
  settings.output_shape = c.spec.shape;
  settings.block_size = c.spec.block_size;
  settings.budget.by_fraction = true;
  settings.budget.keep_fraction = kKeepFraction;
  settings.num_layers = kNumLayers;
  settings.seed = 5;
  settings.numerics = Numerics::kExact;  // bit parity with the CPU
  auto policy = PrepareForRows(engine, settings, c.window());
  if (!policy.ok()) return policy.status();
  TestModelKey key;
  key.kv_heads = static_cast<int32_t>(kKvHeads);
  key.group = static_cast<int32_t>(c.group);
  key.head_dim = static_cast<int32_t>(c.d);
  key.hidden = static_cast<int32_t>(c.hidden);
  key.layers = kNumLayers;
  if (c.spec.lukv_profile) key.profile_window = policy->params.Int("window");
  const absl::Status st = engine.AttachModel(&*policy, TestModel(key), "settings");
  if (!st.ok()) return st;
  return policy;
}

/// The layer tensors of a case (generated per (dtype, n, d, G), shared by the policies).
std::shared_ptr<const ModelLayerData> CaseData(const ModelCase& c) {
  static auto* cache =
      new OnceCache<std::tuple<int, int64_t, int64_t, int64_t>, ModelLayerData>();
  return cache->Get(std::make_tuple(static_cast<int>(c.dtype), c.n, c.d, c.group), [&] {
    return MakeModelLayerData(c.dtype, kKvHeads, c.n, c.d, c.group, std::min(kMaxWindow, c.n),
                              static_cast<uint64_t>(c.n * 1000003 + c.d * 101 + c.group * 7));
  });
}

/// The LayerRequest of a case over `data`.
LayerRequest MakeRequest(const ModelCase& c, const ModelLayerData& data, bool values,
                         bool queries) {
  LayerRequest layer;
  layer.layer_id = kLayerId;
  layer.keys = {data.keys.data(), c.dtype, {kKvHeads, c.n, c.d}};
  if (values) layer.values = {data.values.data(), c.dtype, {kKvHeads, c.n, c.d}};
  if (queries) {
    layer.queries = {data.queries.data(), c.dtype, {kKvHeads * c.group, c.window(), c.d}};
  }
  return layer;
}

/// The budget PolicyEngine builds for a layer of n tokens.
LayerBudget BudgetOf(const ResolvedPolicy& policy, int64_t n) {
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy.settings.budget, n);
  Protection requested = policy.scorer->default_protection(policy.params, budget.kept_per_head);
  if (policy.settings.sink_tokens) requested.sink = *policy.settings.sink_tokens;
  if (policy.settings.recent_tokens) requested.recent = *policy.settings.recent_tokens;
  budget.protection = ClampProtection(requested, budget.kept_per_head, n);
  budget.requested = requested;
  return budget;
}

/// "" when a and b hold the same floats bit for bit, else where they first differ.
std::string FirstBitDifference(const char* what, const std::vector<float>& cpu,
                               const std::vector<float>& gpu, int64_t n) {
  if (cpu.size() != gpu.size()) {
    return absl::StrCat(what, ": cpu has ", cpu.size(), " values, gpu ", gpu.size());
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0) {
      return absl::StrCat(what, " differ first at head ", static_cast<int64_t>(i) / n, " token ",
                          static_cast<int64_t>(i) % n, ": cpu=", cpu[i], " gpu=", gpu[i]);
    }
  }
  return "";
}

/// Scores of one case on both backends, compared bit for bit. "" when equal.
std::string RunScoreCase(const ModelCase& c) {
  PolicyEngine cpu_engine(BuiltinRegistry(), SharedCpu(c.n));
  auto policy = PreparePolicy(c, cpu_engine);
  if (!policy.ok()) return absl::StrCat(c.Describe(), ": ", policy.status().ToString());
  const std::shared_ptr<const ModelLayerData> data = CaseData(c);
  const LayerRequest request = MakeRequest(c, *data, true, true);
  auto validated = cpu_engine.Validate(*policy, request, "layer");
  if (!validated.ok()) return absl::StrCat(c.Describe(), ": ", validated.status().ToString());
  const LayerBudget budget = BudgetOf(*policy, c.n);
  LayerScores cpu, gpu;
  absl::Status st = SharedCpu(c.n).ScoreLayer(*policy, *validated, budget, &cpu);
  if (!st.ok()) return absl::StrCat(c.Describe(), ": CPU: ", st.ToString());
  st = SharedGpu().ScoreLayer(*policy, *validated, budget, &gpu);
  if (!st.ok()) return absl::StrCat(c.Describe(), ": GPU: ", st.ToString());
  std::string diff = FirstBitDifference("scores", cpu.scores, gpu.scores, c.n);
  if (diff.empty()) diff = FirstBitDifference("critical", cpu.critical, gpu.critical, c.n);
  return diff.empty() ? "" : absl::StrCat(c.Describe(), ": ", diff);
}

/// Decisions of one case on both backends under the exact parity rule. "" when equal.
std::string RunDecisionCase(const ModelCase& c) {
  PolicyEngine cpu_engine(BuiltinRegistry(), SharedCpu(c.n));
  PolicyEngine gpu_engine(BuiltinRegistry(), SharedGpu());
  auto policy = PreparePolicy(c, cpu_engine);
  if (!policy.ok()) return absl::StrCat(c.Describe(), ": ", policy.status().ToString());
  const uint32_t needs = policy->scorer->required_inputs;
  const bool large = c.n >= kLargeN;  // V/Q only when the scorer needs them (perturbation cost)
  const std::shared_ptr<const ModelLayerData> data = CaseData(c);
  const LayerRequest request = MakeRequest(c, *data, !large || (needs & kInputValues),
                                           !large || (needs & kInputQueries));
  auto cpu = cpu_engine.CompressLayer(*policy, request, "layer");
  if (!cpu.ok()) return absl::StrCat(c.Describe(), ": CPU: ", cpu.status().ToString());
  auto gpu = gpu_engine.CompressLayer(*policy, request, "layer");
  if (!gpu.ok()) return absl::StrCat(c.Describe(), ": GPU: ", gpu.status().ToString());
  CaseSpec spec{c.spec.label, c.spec.shape, c.dtype, kKvHeads, c.n, c.d, c.group, c.window()};
  const Outcome outcome =
      CompareDecisions(spec, *policy, *cpu, *gpu, [] { return CpuScores(); }, true);
  return outcome.failure;
}

/// Runs `fn` over `cases` on up to hardware_concurrency threads; returns the failures.
std::vector<std::string> RunAll(const std::vector<ModelCase>& cases,
                                const std::function<std::string(const ModelCase&)>& fn) {
  return RunConcurrently(cases, fn);
}

ParamValue Text(const char* v) { return ParamValue::Text(v); }
ParamValue Flag(bool v) { return ParamValue::Number(v ? 1 : 0); }

// ---- Scores ------------------------------------------------------------------------------------

std::vector<PolicySpec> ScoreSpecs() {
  return {
      {"criticalkv_l1", "criticalkv", {{"norm", Text("l1")}}},
      {"criticalkv_l1_avg", "criticalkv", {{"norm", Text("l1")}, {"pooling", Text("avg")}}},
      {"criticalkv_l2", "criticalkv", {{"norm", Text("l2")}}},
      {"laprox_mean", "laprox", {{"gqa", Text("mean")}}},
      {"laprox_head_bound", "laprox", {{"gqa", Text("head_bound")}, {"pooling", Text("max")}}},
      {"laprox_summed_wo", "laprox", {{"gqa", Text("summed_wo")}}},
      {"ea_model", "expected_attention", {{"query_stats", Text("model")}}},
      {"ea_model_no_vnorm", "expected_attention",
       {{"query_stats", Text("model")}, {"use_vnorm", Flag(false)}}},
      {"ea_window", "expected_attention", {{"query_stats", Text("window")}}},
  };
}

struct ScoreParam {
  PolicySpec spec;
  int64_t n = 0;
};

std::vector<ScoreParam> ScoreParams() {
  std::vector<ScoreParam> out;
  for (const PolicySpec& spec : ScoreSpecs()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, kLargeN}) {
      if (n == kLargeN && spec.label == "criticalkv_l1_avg") continue;  // pooling covered below
      out.push_back({spec, n});
    }
  }
  return out;
}

void PrintTo(const ScoreParam& p, std::ostream* os) { *os << p.spec.label << " n=" << p.n; }

class ModelScoreParityTest : public ::testing::TestWithParam<ScoreParam> {};

TEST_P(ModelScoreParityTest, BitIdentical) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const ScoreParam& p = GetParam();
  const bool uses_hidden = p.spec.label.rfind("criticalkv_l1", 0) == 0;
  std::vector<ModelCase> cases;
  for (int64_t group : {4, 1}) {
    for (int64_t d : {128, 64}) {
      for (int64_t hidden : {512, 64}) {
        if (hidden == 512 && (p.n >= kLargeN || !uses_hidden)) continue;
        for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
          cases.push_back({p.spec, dtype, p.n, d, group, hidden});
        }
      }
    }
  }
  for (const std::string& failure : RunAll(cases, RunScoreCase)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

INSTANTIATE_TEST_SUITE_P(Scorers, ModelScoreParityTest, ::testing::ValuesIn(ScoreParams()),
                         [](const ::testing::TestParamInfo<ScoreParam>& info) {
                           return absl::StrCat(info.param.spec.label, "_n", info.param.n);
                         });

// Shapes off the main grid, one case each, small enough for the sanitizers: a hidden size of
// 9 chunks with a partial last one (two chunk groups in the L1 kernel), d = 96 (lanes padded),
// d = 256 (32 elements per lane) and G = 8.
TEST(ModelScoreEdgeShapes, BitIdentical) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<ModelCase> cases;
  for (const PolicySpec& spec : ScoreSpecs()) {
    cases.push_back({spec, DType::kBF16, 99, 64, 4, 520});
    cases.push_back({spec, DType::kF32, 70, 96, 2, 136});
    cases.push_back({spec, DType::kF16, 45, 256, 1, 64});
    cases.push_back({spec, DType::kF32, 99, 64, 8, 64});
  }
  for (const std::string& failure : RunAll(cases, RunScoreCase)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// One small case per kernel family of the model-aware scorers, for compute-sanitizer
// (scripts/gpu_run.sh): the L1 product (two chunk groups, a partial chunk), the per-query-head
// and group-squared window reductions, pooling, the Gram and covariance quadratic forms, the
// Expected Attention softmax, and the combines.
TEST(ModelScoreSanitizer, SmallCases) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<ModelCase> cases;
  for (const PolicySpec& spec : ScoreSpecs()) {
    const std::string& l = spec.label;
    if (l == "criticalkv_l1" || l == "laprox_mean" || l == "laprox_head_bound" ||
        l == "ea_model") {
      cases.push_back({spec, DType::kF32, 99, 64, 4, 520});
    }
  }
  for (const std::string& failure : RunAll(cases, RunScoreCase)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// ---- Decisions ---------------------------------------------------------------------------------

std::vector<PolicySpec> DecisionSpecs() {
  return {
      {"criticalkv", "criticalkv", {}},
      {"criticalkv_adakv", "criticalkv_adakv", {}},
      {"criticalkv_l2_pyramid", "criticalkv+pyramid", {{"norm", Text("l2")}}},
      {"criticalkv_shared", "criticalkv", {}, OutputShape::kShared},
      {"expected_attention", "expected_attention", {}},
      {"expected_attention_window", "expected_attention", {{"query_stats", Text("window")}}},
      {"expected_attention_adakv", "expected_attention+adakv", {}},
      {"expected_attention_pyramid", "expected_attention+pyramid", {}},
      {"expected_attention_shared", "expected_attention", {}, OutputShape::kShared},
      {"lukv", "lukv", {}, OutputShape::kPerHead, 0, true},
      {"laprox_local", "laprox", {{"mode", Text("local")}}},
      {"laprox_layer", "laprox", {{"mode", Text("layer")}, {"gqa", Text("head_bound")}}},
      {"laprox_model", "laprox", {{"mode", Text("model")}, {"gqa", Text("summed_wo")}}},
      {"laprox_equal", "laprox", {}, OutputShape::kEqualCount},
      {"snapkv_block", "snapkv", {}, OutputShape::kBlockAligned, 16},
      {"adakv_block", "adakv", {}, OutputShape::kBlockAligned, 5},
      {"snapkv_equal", "snapkv", {}, OutputShape::kEqualCount},
      {"adakv_equal", "adakv", {}, OutputShape::kEqualCount},
      {"criticalkv_block", "criticalkv", {}, OutputShape::kBlockAligned, 8},
  };
}

struct DecisionParam {
  PolicySpec spec;
  int64_t n = 0;
};

std::vector<DecisionParam> DecisionParams() {
  std::vector<DecisionParam> out;
  for (const PolicySpec& spec : DecisionSpecs()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}}) out.push_back({spec, n});
  }
  return out;
}

void PrintTo(const DecisionParam& p, std::ostream* os) { *os << p.spec.label << " n=" << p.n; }

class ModelDecisionParityTest : public ::testing::TestWithParam<DecisionParam> {};

TEST_P(ModelDecisionParityTest, GpuMatchesCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const DecisionParam& p = GetParam();
  std::vector<ModelCase> cases;
  for (int64_t group : {4, 1}) {
    for (int64_t d : {128, 64}) {
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
        cases.push_back({p.spec, dtype, p.n, d, group, 64});
      }
    }
  }
  for (const std::string& failure : RunAll(cases, RunDecisionCase)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, ModelDecisionParityTest,
                         ::testing::ValuesIn(DecisionParams()),
                         [](const ::testing::TestParamInfo<DecisionParam>& info) {
                           return absl::StrCat(info.param.spec.label, "_n", info.param.n);
                         });

// Long rows: one bf16 case per decision path at n = 40000 (V/Q only where the scorer needs
// them, so the perturbation runs for CriticalKV and LaProx).
TEST(ModelDecisionLongRows, GpuMatchesCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<ModelCase> cases;
  for (const PolicySpec& spec : DecisionSpecs()) {
    const std::string& l = spec.label;
    if (l == "criticalkv" || l == "criticalkv_adakv" || l == "expected_attention" ||
        l == "lukv" || l == "laprox_model" || l == "snapkv_block" || l == "adakv_equal") {
      cases.push_back({spec, DType::kBF16, kLargeN, 128, 4, 64});
    }
  }
  for (const std::string& failure : RunAll(cases, RunDecisionCase)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// ---- Model cache -----------------------------------------------------------------------------

/// A criticalkv case's policy and request on a fresh model of its own.
struct OwnModelCase {
  ModelCase c;
  ResolvedPolicy policy;
  std::shared_ptr<const ModelLayerData> data;
};

OwnModelCase MakeOwnModelCase(const PolicyEngine& engine, uint64_t seed, const char* norm) {
  OwnModelCase o;
  o.c = {{"criticalkv", "criticalkv", {{"norm", Text(norm)}}}, DType::kBF16, 300, 64, 2, 128};
  CompressionSettings settings;
  settings.policy = "criticalkv";
  settings.numerics = Numerics::kExact;
  settings.params = o.c.spec.params;
  settings.budget.keep_fraction = kKeepFraction;
  settings.num_layers = kNumLayers;
  auto policy = engine.Prepare(settings, "settings");
  EXPECT_TRUE(policy.ok()) << policy.status();
  RandomModelOptions options;
  options.layers = kNumLayers;
  options.kv_heads = static_cast<int32_t>(kKvHeads);
  options.query_heads = static_cast<int32_t>(kKvHeads * 2);
  options.head_dim = 64;
  options.hidden = 128;
  options.seed = seed;
  EXPECT_TRUE(engine.AttachModel(&*policy, RandomModel(options), "settings").ok());
  o.policy = *policy;
  o.data = CaseData(o.c);
  return o;
}

// Entries die with their model, stay under a byte cap (LRU) and refuse a tensor above it;
// every answer matches the CPU meanwhile.
TEST(GpuModelCacheTest, EvictsWithTheModelAndUnderTheCap) {
  KVTRIM_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  PolicyEngine cpu_engine(BuiltinRegistry(), cpu);
  // W_O of one layer: H_q * D * 8E floats = 6 * 128 * 64 * 4 bytes = 192 KiB; a Gram: 6 * 64 *
  // 64 * 4 = 96 KiB. A 256 KiB cap holds one W_O, or one W_O and nothing else.
  GpuBackendOptions options;
  options.workers = 2;
  options.model_cache_bytes = 256 << 10;
  auto backend = testing::CreateGpuBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  PolicyEngine gpu_engine(BuiltinRegistry(), **backend);
  auto check = [&](const OwnModelCase& o) {
    const LayerRequest request = MakeRequest(o.c, *o.data, true, true);
    auto want = cpu_engine.CompressLayer(o.policy, request, "layer");
    auto got = gpu_engine.CompressLayer(o.policy, request, "layer");
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(want->offsets, got->offsets);
    EXPECT_EQ(want->indices, got->indices);
  };
  {
    OwnModelCase a = MakeOwnModelCase(cpu_engine, 101, "l1");
    check(a);
    EXPECT_EQ((*backend)->model_cache().size(), 1u);
    check(a);  // a hit
    EXPECT_EQ((*backend)->model_cache().size(), 1u);
    OwnModelCase b = MakeOwnModelCase(cpu_engine, 202, "l2");
    check(b);  // 192 + 96 KiB > 256 KiB: a's W_O is evicted
    EXPECT_EQ((*backend)->model_cache().size(), 1u);
    EXPECT_LE((*backend)->model_cache().bytes(), size_t{256} << 10);
    check(a);  // reloaded
  }
  // Both models are gone: their entries go at the next lookup.
  OwnModelCase c = MakeOwnModelCase(cpu_engine, 303, "l2");
  check(c);
  EXPECT_EQ((*backend)->model_cache().size(), 1u);

  // A tensor above the cap is refused; the backend stays usable.
  options.model_cache_bytes = 64 << 10;
  auto small = testing::CreateGpuBackend(options);
  ASSERT_TRUE(small.ok()) << small.status();
  PolicyEngine small_engine(BuiltinRegistry(), **small);
  const LayerRequest request = MakeRequest(c.c, *c.data, true, true);
  auto refused = small_engine.CompressLayer(c.policy, request, "layer");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE((*small)->healthy());
}

// ---- Launcher edges ----------------------------------------------------------------------------

TEST(ModelScoreLauncherTest, RefusesInvalidArguments) {
  KVTRIM_SKIP_WITHOUT_GPU();
  DeviceLayer layer;
  layer.dtype = DType::kF32;
  layer.num_kv_heads = 2;
  layer.num_tokens = 10;
  layer.head_dim = 64;
  layer.softmax_scale = 0.125f;
  static const float kDummy = 0;
  layer.keys = &kDummy;
  ScorerParams params;
  params.window = 4;
  params.kernel = 7;
  DeviceModelInputs model;
  // No queries / values / model tensors.
  EXPECT_EQ(ModelScoreScratchBytes(ScorerKind::kCriticalKV, layer, params, model), 0u);
  EXPECT_EQ(LaunchModelScore(ScorerKind::kCriticalKV, layer, params, model, nullptr, nullptr,
                             nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchModelScore(ScorerKind::kExpectedAttention, layer, params, model, nullptr,
                             nullptr, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // Not a model scorer (LaunchScore takes window-attention traits, never a model scorer).
  EXPECT_EQ(LaunchModelScore(ScorerKind::kTable, layer, params, model, nullptr, nullptr,
                             nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // Expected Attention with everything but enough scratch.
  model.ea_mean = model.ea_cov = &kDummy;
  model.num_query_heads = 4;
  layer.values = &kDummy;
  const size_t need = ModelScoreScratchBytes(ScorerKind::kExpectedAttention, layer, params, model);
  EXPECT_GT(need, 0u);
  float* scores = nullptr;
  ASSERT_EQ(cudaMalloc(&scores, 2 * 10 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(LaunchModelScore(ScorerKind::kExpectedAttention, layer, params, model, scores,
                             nullptr, scores, need - 1, nullptr),
            cudaErrorInvalidValue);
  // n = 0 launches nothing.
  layer.num_tokens = 0;
  EXPECT_EQ(LaunchModelScore(ScorerKind::kExpectedAttention, layer, params, model, scores,
                             nullptr, nullptr, 0, nullptr),
            cudaSuccess);
  cudaFree(scores);
}

}  // namespace
}  // namespace kvtrim::gpu::testing
