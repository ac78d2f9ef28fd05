// Fast vs exact numerics of the model-aware scorers (kernels/gpu/kernels/fast_model.cuh): CriticalKV
// (l1, l2: the attention and critical arrays), LaProx (gqa mean, head_bound, summed_wo) and
// Expected Attention (with and without ||v||), through GpuBackend::ScoreLayer with the raw
// scores of each mode:
//   * the band of docs/numerics.md on the scores themselves: max |fast - exact| / (|exact| +
//     scale_h) <= tau = 2^-11 (scale_h = the largest finite |exact| of the head, per array),
//     non-finite scores equal, over f32 / f16 / bf16, n in {1, 7, 99, 1000, 40000},
//     d in {64, 128}, G in {1, 4, 8}, H_kv = 3, hidden D = 64 (w = min(32, n), the window
//     lowered to w); CriticalKV l1 also at D in {520, 4096} (a partial W_O chunk, a real o_proj);
//   * FastModelScores.ReductionLayouts: the window statistics' reductions of the fast
//     attention passes (per-query-head mean, sqrt(sum p^2), group-mean squares) over the
//     layouts of their segments: windows T in {3, 5, 7, 32, 64, 130, 256} and G in
//     {1, 2, 3, 4, 7, 20, 40} (segments within a thread, a warp, a CTA, several chunks;
//     padded T and G; G > 32 for the group mean: the canonical passes);
//   * every fast request reports fast, every exact one exact;
//   * FastModelSanitizer.*: small cases of every kernel variant (for compute-sanitizer);
//   * FastModelLauncher.*: the launcher's edges and errors, and the f16 W_O image built on the
//     device equal to the host's.
// Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/device_pipeline.h"
#include "kernels/gpu/kernels/fast_model.cuh"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/registry.h"
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
/// The band of docs/numerics.md.
constexpr double kTau = 1.0 / 2048.0;

ParamValue Text(const char* v) { return ParamValue::Text(v); }
ParamValue Flag(bool v) { return ParamValue::Number(v ? 1 : 0); }

/// A model-aware scorer configuration.
struct ModelSpec {
  std::string label;
  std::string policy;
  std::map<std::string, ParamValue> params;
};

/// Every fast kernel path: L1 GEMM, Gram quadratic forms (head and group matrices, per-head
/// and group-squared attention), Expected Attention's logits with and without ||v||.
std::vector<ModelSpec> Specs() {
  return {
      {"criticalkv_l1", "criticalkv", {{"norm", Text("l1")}}},
      {"criticalkv_l2", "criticalkv", {{"norm", Text("l2")}}},
      {"laprox_mean", "laprox", {{"gqa", Text("mean")}}},
      {"laprox_head_bound", "laprox", {{"gqa", Text("head_bound")}, {"pooling", Text("max")}}},
      {"laprox_summed_wo", "laprox", {{"gqa", Text("summed_wo")}}},
      {"ea_model", "expected_attention", {{"query_stats", Text("model")}}},
      {"ea_model_no_vnorm", "expected_attention",
       {{"query_stats", Text("model")}, {"use_vnorm", Flag(false)}}},
  };
}

/// One case: a scorer configuration at (dtype, n, d, G, D), max_window query rows sent at
/// most (w = min(max_window, n)).
struct ModelCase {
  ModelSpec spec;
  DType dtype = DType::kBF16;
  int64_t n = 0, d = 64, group = 1, hidden = 64;
  int64_t max_window = kMaxWindow;
  int64_t window() const { return std::min(max_window, n); }
  std::string Describe() const {
    return absl::StrCat(spec.label, " dtype=", DTypeName(dtype), " n=", n, " d=", d, " G=", group,
                        " D=", hidden, " H_kv=", kKvHeads, " w=", window());
  }
};

/// `spec` reading `window` rows per query head (its label says so).
ModelSpec WithWindow(ModelSpec spec, int64_t window) {
  spec.label = absl::StrCat(spec.label, "_window", window);
  spec.params["window"] = ParamValue::Number(static_cast<double>(window));
  return spec;
}

/// The case's policy in `mode`, its window lowered to w and its model attached.
absl::StatusOr<ResolvedPolicy> Prepare(const PolicyEngine& engine, const ModelCase& c,
                                       Numerics mode) {
  CompressionSettings settings;
  settings.policy = c.spec.policy;
  settings.params = c.spec.params;
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
  key.hidden = static_cast<int32_t>(c.hidden);
  key.layers = kNumLayers;
  const absl::Status st = engine.AttachModel(&*policy, TestModel(key), "settings");
  if (!st.ok()) return st;
  return policy;
}

/// The layer tensors of (dtype, n, d, G, w), generated once and shared by every spec.
std::shared_ptr<const ModelLayerData> CaseData(const ModelCase& c) {
  static auto* cache =
      new OnceCache<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, ModelLayerData>();
  return cache->Get(std::make_tuple(static_cast<int>(c.dtype), c.n, c.d, c.group, c.window()),
                    [&] {
                      return MakeModelLayerData(
                          c.dtype, kKvHeads, c.n, c.d, c.group, c.window(),
                          static_cast<uint64_t>(c.n * 6007 + c.d * 37 + c.group * 5 + 2));
                    });
}

/// The layer request of a case (keys, values and queries always sent).
LayerRequest RequestOf(const ModelCase& c, const ModelLayerData& data) {
  LayerRequest layer;
  layer.layer_id = kLayerId;
  layer.keys = {data.keys.data(), c.dtype, {kKvHeads, c.n, c.d}};
  layer.values = {data.values.data(), c.dtype, {kKvHeads, c.n, c.d}};
  layer.queries = {data.queries.data(), c.dtype, {kKvHeads * c.group, c.window(), c.d}};
  return layer;
}

/// The budget PolicyEngine builds for a layer of n tokens.
LayerBudget BudgetOf(const ResolvedPolicy& policy, int64_t n) {
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy.settings.budget, n);
  const Protection requested =
      policy.scorer->default_protection(policy.params, budget.kept_per_head);
  budget.protection = ClampProtection(requested, budget.kept_per_head, n);
  budget.requested = requested;
  return budget;
}

/// The raw scores of a case in `mode` (GpuBackend::ScoreLayer); "" or what went wrong.
std::string RawScores(const ModelCase& c, Numerics mode, LayerScores* out) {
  PolicyEngine engine(BuiltinRegistry(), SharedGpu());
  auto policy = Prepare(engine, c, mode);
  if (!policy.ok()) return policy.status().ToString();
  const std::shared_ptr<const ModelLayerData> held = CaseData(c);
  const LayerRequest request = RequestOf(c, *held);
  auto validated = engine.Validate(*policy, request, "layer");
  if (!validated.ok()) return validated.status().ToString();
  const absl::Status st = SharedGpu().ScoreLayer(*policy, *validated, BudgetOf(*policy, c.n), out);
  if (!st.ok()) return st.ToString();
  const Numerics expected =
      mode == Numerics::kFast && HasFastPath(*policy->scorer, c.dtype, c.d) ? Numerics::kFast
                                                                                 : Numerics::kExact;
  if (out->numerics != expected) {
    return absl::StrCat("computed ", NumericsName(out->numerics), ", expected ",
                        NumericsName(expected));
  }
  return "";
}

/// Max |f - e| / (|e| + scale_h) over the finite scores of [H_kv, n] arrays (scale_h: the
/// largest finite |e| of head h); a failure text when finiteness or a non-finite value differs.
std::string RelativeError(const char* what, const std::vector<float>& exact,
                          const std::vector<float>& fast, int64_t n, double* error) {
  if (exact.size() != fast.size() || exact.size() != static_cast<size_t>(kKvHeads * n)) {
    return absl::StrCat(what, ": ", exact.size(), " exact values, ", fast.size(), " fast");
  }
  const std::vector<double> scale = HeadScales(exact, kKvHeads, n);
  for (int64_t h = 0; h < kKvHeads; ++h) {
    for (int64_t j = 0; j < n; ++j) {
      const double e = exact[h * n + j];
      const double f = fast[h * n + j];
      if (!std::isfinite(e) || !std::isfinite(f)) {
        if (std::isfinite(e) != std::isfinite(f) || e != f) {
          return absl::StrCat(what, " head ", h, " token ", j, ": exact ", e, " fast ", f);
        }
        continue;
      }
      *error = std::max(*error, std::fabs(f - e) / (std::fabs(e) + scale[h]));
    }
  }
  return "";
}

/// What one case found.
struct Measured {
  std::string failure;
  double scores = 0;    // largest relative error of the scores (CriticalKV: attention)
  double critical = 0;  // CriticalKV: of the critical array
};

/// Exact and fast raw scores of a case, compared.
Measured Compare(const ModelCase& c) {
  Measured m;
  LayerScores exact, fast;
  std::string failure = RawScores(c, Numerics::kExact, &exact);
  if (failure.empty()) failure = RawScores(c, Numerics::kFast, &fast);
  if (failure.empty()) failure = RelativeError("scores", exact.scores, fast.scores, c.n, &m.scores);
  if (failure.empty() && (!exact.critical.empty() || !fast.critical.empty())) {
    failure = RelativeError("critical", exact.critical, fast.critical, c.n, &m.critical);
  }
  if (!failure.empty()) m.failure = absl::StrCat(c.Describe(), ": ", failure);
  return m;
}

/// Runs `cases`, prints each case's errors and expects the band.
void ExpectWithinBand(const std::vector<ModelCase>& cases) {
  const std::vector<Measured> measured = RunConcurrently(cases, Compare);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Measured& m = measured[i];
    std::printf("[ fast     ] %s: max relative error %.3g, critical %.3g (tau %.3g)\n",
                cases[i].Describe().c_str(), m.scores, m.critical, kTau);
    EXPECT_TRUE(m.failure.empty()) << m.failure;
    EXPECT_LE(m.scores, kTau) << cases[i].Describe();
    EXPECT_LE(m.critical, kTau) << cases[i].Describe() << " (critical)";
  }
}

TEST(FastModelScores, CloseToExact) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<ModelCase> cases;
  for (const ModelSpec& spec : Specs()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, int64_t{40000}}) {
      for (int64_t d : {128, 64}) {
        for (int64_t group : {8, 4, 1}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            cases.push_back({spec, dtype, n, d, group, 64});
          }
        }
      }
    }
  }
  ExpectWithinBand(cases);
}

// CriticalKV l1 with hidden sizes that end in a partial W_O chunk (520) and Llama's o_proj
// (4096), where the rounding errors of W_O average over more columns.
TEST(FastModelScores, CriticalKVHiddenSizes) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<ModelCase> cases;
  const ModelSpec spec = Specs().front();
  for (int64_t hidden : {520, 4096}) {
    for (int64_t n : {int64_t{99}, int64_t{1000}}) {
      for (int64_t d : {128, 64}) {
        for (int64_t group : {4, 1}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            cases.push_back({spec, dtype, n, d, group, hidden});
          }
        }
      }
    }
  }
  ExpectWithinBand(cases);
}

/// The scorers whose window statistics take each reduction of the fast attention passes:
/// CriticalKV (per-query-head mean), LaProx head_bound (per-query-head sqrt(sum p^2)), LaProx
/// mean and summed_wo (sqrt(sum_t m_t^2) of the group mean).
std::vector<ModelSpec> ReductionSpecs() {
  const std::vector<ModelSpec> all = Specs();
  return {all[0], all[3], all[2], all[4]};
}

/// One layout of the reductions' segments: G, the query rows sent and the window read.
struct ReductionShape {
  int64_t group, rows_sent, window;
};

/// Shapes that reach every segment layout of fast_attention.cu (B = rows of a warp of pass B,
/// RC = rows of a chunk; S = T (per query head) or G (group mean) rounded up to a power of 2):
std::vector<ReductionShape> ReductionShapes() {
  return {
      {1, 3, 3},      // per q: S = 4, two slots of a thread x two lanes (RC = 16); group: S = 1
      {2, 8, 5},      // per q: S = 8 over four lanes, padded t; group: S = 2 in a thread
      {3, 32, 32},    // per q: a warp per head, the fourth row group idle; group: padded g
      {7, 32, 7},     // padded t and g; group: S = 8 over two lanes
      {4, 64, 64},    // per q: S = 64 > B, two row groups, two chunks; group: finish kernel
      {1, 64, 64},    // per q: one head over two of four row groups
      {1, 256, 256},  // per q: S = 256 > RC: two chunks added by the finish kernel
      {2, 160, 130},  // per q: S = 256, padded t, four chunks
      {20, 32, 32},   // group: S = 32 (a whole warp; 128-row chunks), eight chunks
      {40, 32, 9},    // group: G > 32 takes the canonical passes; per q: S = 16, five chunks
  };
}

// The window statistics over every layout of their segments (ReductionShapes), within the
// band: f32 / f16 / bf16, d in {64, 128}, n in {300, 2000}.
TEST(FastModelScores, ReductionLayouts) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<ModelCase> cases;
  for (const ModelSpec& spec : ReductionSpecs()) {
    for (const ReductionShape& shape : ReductionShapes()) {
      for (int64_t n : {int64_t{300}, int64_t{2000}}) {
        for (int64_t d : {128, 64}) {
          for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
            ModelCase c{WithWindow(spec, shape.window), dtype, n, d, shape.group, 64};
            c.max_window = shape.rows_sent;
            cases.push_back(c);
          }
        }
      }
    }
  }
  ExpectWithinBand(cases);
}

// Small shapes of every fast kernel variant (both padded dimensions, 16-bit and f32 tiles,
// regrouped queries), one case at a time, for compute-sanitizer (memcheck, racecheck).
TEST(FastModelSanitizer, SmallCases) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (const ModelSpec& spec : Specs()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t d : {64, 128}) {
        for (int64_t group : {1, 4}) {
          const ModelCase c{spec, dtype, 99, d, group, 72};
          const Measured m = Compare(c);
          EXPECT_TRUE(m.failure.empty()) << m.failure;
          EXPECT_LE(m.scores, kTau) << c.Describe();
          EXPECT_LE(m.critical, kTau) << c.Describe() << " (critical)";
        }
      }
    }
  }
}

// The reductions of the window statistics over every segment layout (ReductionShapes), small,
// one case at a time, for compute-sanitizer.
TEST(FastModelSanitizer, ReductionLayouts) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (const ModelSpec& spec : ReductionSpecs()) {
    for (const ReductionShape& shape : ReductionShapes()) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        ModelCase c{WithWindow(spec, shape.window), dtype, 300, 64, shape.group, 72};
        c.max_window = shape.rows_sent;
        const Measured m = Compare(c);
        EXPECT_TRUE(m.failure.empty()) << m.failure;
        EXPECT_LE(m.scores, kTau) << c.Describe();
        EXPECT_LE(m.critical, kTau) << c.Describe() << " (critical)";
      }
    }
  }
}

// ---- The launcher ---------------------------------------------------------------------------

/// A device allocation freed at scope exit.
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

TEST(FastModelLauncher, WhichScorersAndShapesAreFast) {
  for (ScorerKind kind : {ScorerKind::kCriticalKV, ScorerKind::kLaProx,
                          ScorerKind::kExpectedAttention}) {
    ScorerSpec spec;
    spec.kind = kind;
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int32_t d : {8, 64, 96, 128}) {
        EXPECT_TRUE(FastModelSupported(kind, dtype, d)) << d;
        EXPECT_TRUE(HasFastPath(spec, dtype, d)) << d;
      }
      for (int32_t d : {0, 4, 100, 136, 256}) {
        EXPECT_FALSE(FastModelSupported(kind, dtype, d)) << d;
        EXPECT_FALSE(HasFastPath(spec, dtype, d)) << d;
      }
    }
  }
  EXPECT_FALSE(FastModelSupported(ScorerKind::kTable, DType::kBF16, 128));
}

TEST(FastModelLauncher, EdgesAndErrors) {
  KVTRIM_SKIP_WITHOUT_GPU();
  constexpr int32_t kHeads = 2, kGroup = 2, kD = 64, kW = 4, kHidden = 40;
  constexpr int64_t kN = 16;
  const int64_t vf = LaneMajorFloats(kD);
  DeviceBytes keys(kHeads * kN * kD * 2), values(kHeads * kN * kD * 2);
  DeviceBytes queries(kHeads * kGroup * kW * kD * 2);
  DeviceBytes gram(kHeads * kGroup * kD * vf * sizeof(float));
  DeviceBytes mean(kHeads * kGroup * vf * sizeof(float));
  const FastWoLayout wl = MakeFastWoLayout(kHeads * kGroup, kD, kHidden);
  DeviceBytes w16(wl.bytes);
  DeviceBytes out(2 * kHeads * kN * sizeof(float));
  ASSERT_EQ(cudaMemset(keys.p, 0, kHeads * kN * kD * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(values.p, 0, kHeads * kN * kD * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(queries.p, 0, kHeads * kGroup * kW * kD * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(gram.p, 0, kHeads * kGroup * kD * vf * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(mean.p, 0, kHeads * kGroup * vf * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(w16.p, 0, wl.bytes), cudaSuccess);

  DeviceLayer layer;
  layer.keys = keys.p;
  layer.values = values.p;
  layer.queries = queries.p;
  layer.dtype = DType::kBF16;
  layer.num_kv_heads = kHeads;
  layer.num_query_heads = kHeads * kGroup;
  layer.window_rows = kW;
  layer.head_dim = kD;
  layer.num_tokens = kN;
  layer.softmax_scale = 0.125f;
  ScorerParams params;
  params.window = kW;
  params.kernel = 3;
  params.eps = 1e-4f;
  params.fast = true;
  DeviceModelInputs model;
  model.head_gram = model.group_gram = model.ea_cov = static_cast<const float*>(gram.p);
  model.ea_mean = static_cast<const float*>(mean.p);
  model.hidden = kHidden;
  model.num_query_heads = kHeads * kGroup;
  model.half_scale2 = 0.5f / kD;
  FastModelInputs fast_inputs;
  fast_inputs.w_o16 = w16.p;
  float* scores = static_cast<float*>(out.p);
  float* critical = scores + kHeads * kN;

  for (ScorerKind kind : {ScorerKind::kCriticalKV, ScorerKind::kLaProx,
                          ScorerKind::kExpectedAttention}) {
    const size_t bytes = FastModelScoreScratchBytes(kind, layer, params, model, fast_inputs);
    ASSERT_GT(bytes, 0u) << static_cast<int>(kind);
    DeviceBytes scratch(bytes);
    // A zero-filled layer scores without error; the outputs are finite.
    EXPECT_EQ(LaunchFastModelScore(kind, layer, params, model, fast_inputs, scores, critical,
                                   scratch.p, bytes, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> host(2 * kHeads * kN);
    ASSERT_EQ(cudaMemcpy(host.data(), out.p, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (float v : host) EXPECT_TRUE(std::isfinite(v));
    // Scratch one byte short, null outputs, null scratch.
    EXPECT_EQ(LaunchFastModelScore(kind, layer, params, model, fast_inputs, scores, critical,
                                   scratch.p, bytes - 1, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(LaunchFastModelScore(kind, layer, params, model, fast_inputs, nullptr, critical,
                                   scratch.p, bytes, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(LaunchFastModelScore(kind, layer, params, model, fast_inputs, scores, critical,
                                   nullptr, bytes, nullptr),
              cudaErrorInvalidValue);
    // d the fast kernels do not take: no scratch, refused.
    DeviceLayer odd = layer;
    odd.head_dim = 100;
    EXPECT_EQ(FastModelScoreScratchBytes(kind, odd, params, model, fast_inputs), 0u);
    EXPECT_EQ(LaunchFastModelScore(kind, odd, params, model, fast_inputs, scores, critical,
                                   scratch.p, bytes, nullptr),
              cudaErrorInvalidValue);
    // n = 0 launches nothing and succeeds, even without outputs.
    DeviceLayer empty = layer;
    empty.num_tokens = 0;
    EXPECT_EQ(LaunchFastModelScore(kind, empty, params, model, fast_inputs, nullptr, nullptr,
                                   nullptr, 0, nullptr),
              cudaSuccess);
  }
  // CriticalKV l1 without its f16 W_O image, or without a critical output.
  {
    FastModelInputs none;
    EXPECT_EQ(FastModelScoreScratchBytes(ScorerKind::kCriticalKV, layer, params, model, none), 0u);
    const size_t bytes =
        FastModelScoreScratchBytes(ScorerKind::kCriticalKV, layer, params, model, fast_inputs);
    DeviceBytes scratch(bytes);
    EXPECT_EQ(LaunchFastModelScore(ScorerKind::kCriticalKV, layer, params, model, none, scores,
                                   critical, scratch.p, bytes, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(LaunchFastModelScore(ScorerKind::kCriticalKV, layer, params, model, fast_inputs,
                                   scores, nullptr, scratch.p, bytes, nullptr),
              cudaErrorInvalidValue);
  }
  // Not a model scorer; Expected Attention without its statistics; an even pooling kernel.
  EXPECT_EQ(FastModelScoreScratchBytes(ScorerKind::kTable, layer, params, model, fast_inputs), 0u);
  {
    DeviceModelInputs no_stats = model;
    no_stats.ea_cov = nullptr;
    EXPECT_EQ(FastModelScoreScratchBytes(ScorerKind::kExpectedAttention, layer, params, no_stats,
                                         fast_inputs),
              0u);
    ScorerParams even = params;
    even.kernel = 2;
    EXPECT_EQ(FastModelScoreScratchBytes(ScorerKind::kLaProx, layer, even, model, fast_inputs), 0u);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The f16 W_O image built on the device from the lane-major fp32 copy is the host's, bit for
// bit (scales, rounding, zero padding), for both padded dimensions.
TEST(FastModelLauncher, DeviceWoImageMatchesHost) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int32_t d : {40, 64, 128}) {
    constexpr int32_t kHq = 3, kHidden = 70;
    std::vector<float> w_o(static_cast<size_t>(kHidden) * kHq * d);  // [D, H_q * d]
    for (size_t i = 0; i < w_o.size(); ++i) {
      // Per-head magnitudes far apart (scales differ) and some exact zeros.
      const int64_t q = static_cast<int64_t>(i % (kHq * d)) / d;
      w_o[i] = i % 11 == 0 ? 0.0f : std::ldexp(HashNormal(91, i), static_cast<int>(-12 * q));
    }
    const std::vector<uint8_t> host = FastWoImage(w_o.data(), kHq, d, kHidden);
    const FastWoLayout l = MakeFastWoLayout(kHq, d, kHidden);
    ASSERT_EQ(host.size(), l.bytes);
    const int64_t vf = LaneMajorFloats(d);
    std::vector<float> lane(static_cast<size_t>(kHq * kHidden * vf));
    for (int32_t q = 0; q < kHq; ++q) {
      ToLaneMajor(w_o.data() + q * d, kHidden, d, kHq * d, lane.data() + q * kHidden * vf);
    }
    DeviceBytes lane_dev(lane.size() * sizeof(float)), image(l.bytes);
    ASSERT_EQ(cudaMemcpy(lane_dev.p, lane.data(), lane.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(image.p, 0, l.bytes), cudaSuccess);
    ASSERT_EQ(LaunchBuildFastWo(static_cast<const float*>(lane_dev.p), kHq, d, kHidden, image.p,
                                nullptr),
              cudaSuccess);
    std::vector<uint8_t> device(l.bytes);
    ASSERT_EQ(cudaMemcpy(device.data(), image.p, l.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(host.data(), device.data(), l.bytes), 0) << "d=" << d;
  }
  EXPECT_EQ(LaunchBuildFastWo(nullptr, 3, 64, 70, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_TRUE(FastWoImage(nullptr, 3, 100, 70).empty());
}

}  // namespace
}  // namespace kvtrim::gpu::testing
