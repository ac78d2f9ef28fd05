// Decisions on the device (issue 12): GpuBackend::DecideModelWide (LaProx over every layer) and
// the host_decide layers of CompressLayer decided by EnqueueDecision, against the host code
// (DecideLaProx, and the CPU backend through PolicyEngine), list for list.
//
//   DeviceModelWide.MatchesDecideLaProx     synthetic scores with ties inside and across layers,
//                                           n in {1, 7, 99, 1000, 40000}, H_kv in {1, 3, 8},
//                                           modes model / model_raw / local / layer and
//                                           EQUAL_COUNT, scores resident, uploaded or mixed
//   DeviceModelWide.EngineMatchesCpu        the LaProx scorer through PolicyEngine (ScoreLayer
//                                           keeps the scores on the device, DecideModelWide)
//                                           against the CPU engine, as a session runs them
//   DeviceModelWide.ScoreBufferCap          RESOURCE_EXHAUSTED past the buffer cap, memory
//                                           given back with the handles
//   DeviceModelWide.ForeignScores           scores of another backend: FAILED_PRECONDITION
//   DeviceModelWide.Timing32Layers          prints the decision time at 32 x 8 x 131072
//   DeviceDecisionSanitizer.*               small cases for compute-sanitizer
// Skips without a GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/decide/decide.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/registry.h"
#include "tests/gpu/gpu_backend_for_tests.h"
#include "tests/gpu/model_test_data.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr double kKeepFraction = 0.3;

/// A laprox policy in `mode` with `shape`, exact numerics (resolved without a model: the
/// decisions read only the mode and the shape).
ResolvedPolicy LaProxPolicy(const std::string& mode, OutputShape shape, double keep_fraction) {
  CompressionSettings settings;
  settings.policy = "laprox";
  settings.params["mode"] = ParamValue::Text(mode);
  settings.output_shape = shape;
  settings.budget.by_fraction = true;
  settings.budget.keep_fraction = keep_fraction;
  settings.numerics = Numerics::kExact;
  auto policy = BuiltinRegistry().Resolve(settings, "settings");
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *std::move(policy);
}

/// Non-negative scores [H, n] like LaProx's p, with ties: every 17th token repeats the one 5
/// before it, every 29th is 0, and every value is rounded to 12 bits of mantissa.
std::vector<float> SyntheticScores(int64_t heads, int64_t n, uint64_t seed) {
  std::vector<float> s(static_cast<size_t>(heads * n));
  for (size_t i = 0; i < s.size(); ++i) {
    const float v = std::fabs(HashNormal(seed, i)) * 1e-3f;
    s[i] = std::ldexp(std::round(std::ldexp(v, 22)), -22);
  }
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 8; j < n; j += 17) s[h * n + j] = s[h * n + j - 5];
    for (int64_t j = 3; j < n; j += 29) s[h * n + j] = 0.0f;
  }
  return s;
}

/// A buffered layer as PolicyEngine::ScoreLayer returns it, over `scores`.
LayerScores MakeLayer(const ResolvedPolicy& policy, int32_t id, int64_t heads, int64_t n,
                      std::vector<float> scores) {
  LayerScores layer;
  layer.layer_id = id;
  layer.num_layers = 32;
  layer.num_heads = heads;
  layer.num_tokens = n;
  layer.scores = std::move(scores);
  layer.budget.kept_per_head = KeptCount(policy.settings.budget, n);
  layer.budget.requested = Protection{4, 8};
  layer.budget.protection = ClampProtection(layer.budget.requested, layer.budget.kept_per_head, n);
  layer.numerics = Numerics::kExact;
  return layer;
}

/// "" when the decisions are equal (lists, counts, shape, numerics), else the first difference.
std::string DecisionDiff(const LayerDecision& want, const LayerDecision& got) {
  if (want.layer_id != got.layer_id || want.num_tokens != got.num_tokens) {
    return absl::StrCat("layer ", want.layer_id, "/", want.num_tokens, " answered as ",
                        got.layer_id, "/", got.num_tokens);
  }
  if (want.output_shape != got.output_shape) return "output shapes differ";
  if (want.numerics != got.numerics) return "numerics differ";
  if (want.offsets != got.offsets) {
    for (size_t i = 0; i < std::min(want.offsets.size(), got.offsets.size()); ++i) {
      if (want.offsets[i] != got.offsets[i]) {
        return absl::StrCat("offsets differ first at list ", i, ": host=", want.offsets[i],
                            " gpu=", got.offsets[i]);
      }
    }
    return absl::StrCat("offsets: host has ", want.offsets.size(), ", gpu ", got.offsets.size());
  }
  for (size_t i = 0; i < want.indices.size() && i < got.indices.size(); ++i) {
    if (want.indices[i] != got.indices[i]) {
      const size_t list = static_cast<size_t>(
          std::upper_bound(want.offsets.begin(), want.offsets.end(), static_cast<int64_t>(i)) -
          want.offsets.begin() - 1);
      return absl::StrCat("list ", list, " differs first at position ", i, ": host=",
                          want.indices[i], " gpu=", got.indices[i]);
    }
  }
  if (want.indices.size() != got.indices.size()) return "index counts differ";
  if (want.kept_per_head != got.kept_per_head) return "kept_per_head differs";
  if (want.perturbation.size() != got.perturbation.size()) return "perturbation sizes differ";
  for (size_t h = 0; h < want.perturbation.size(); ++h) {
    if (std::fabs(got.perturbation[h] - want.perturbation[h]) >
        1e-9 * std::fabs(want.perturbation[h]) + 1e-12) {
      return absl::StrCat("perturbation of head ", h, ": host=", want.perturbation[h],
                          " gpu=", got.perturbation[h]);
    }
  }
  return "";
}

/// "" when every layer's decision is equal.
std::string DecisionsDiff(const std::vector<LayerDecision>& want,
                          const std::vector<LayerDecision>& got) {
  if (want.size() != got.size()) {
    return absl::StrCat("host decided ", want.size(), " layers, gpu ", got.size());
  }
  for (size_t l = 0; l < want.size(); ++l) {
    const std::string diff = DecisionDiff(want[l], got[l]);
    if (!diff.empty()) return absl::StrCat("layers[", l, "]: ", diff);
  }
  return "";
}

/// Where the GPU decision's layers come from.
enum class Residence { kHost, kDevice, kMixed };

const char* ResidenceName(Residence r) {
  return r == Residence::kHost ? "host" : (r == Residence::kDevice ? "device" : "mixed");
}

/// One model-wide case.
struct WideCase {
  std::string mode;
  OutputShape shape = OutputShape::kPerHead;
  int64_t heads = 3;
  int64_t n = 99;
  int num_layers = 3;
  Residence residence = Residence::kDevice;
  std::string Describe() const {
    return absl::StrCat("mode=", mode, shape == OutputShape::kEqualCount ? " EQUAL_COUNT" : "",
                        " H_kv=", heads, " n=", n, " L=", num_layers, " scores=",
                        ResidenceName(residence));
  }
};

/// Layers of a case: layer 1 repeats layer 0's scores (ties across layers, also after the
/// normalisation), the last has n / 2 + 1 tokens when there are more than two.
std::vector<LayerScores> WideLayers(const ResolvedPolicy& policy, const WideCase& c) {
  std::vector<LayerScores> layers;
  for (int l = 0; l < c.num_layers; ++l) {
    const int64_t n = l == c.num_layers - 1 && c.num_layers > 2 ? c.n / 2 + 1 : c.n;
    const uint64_t seed = static_cast<uint64_t>(l == 1 ? 0 : l) * 7919 + static_cast<uint64_t>(c.n);
    layers.push_back(MakeLayer(policy, l, c.heads, n, SyntheticScores(c.heads, n, seed)));
  }
  return layers;
}

/// DecideLaProx and the GPU's DecideModelWide on the same scores; "" when equal.
std::string RunWideCase(const WideCase& c) {
  const ResolvedPolicy policy = LaProxPolicy(c.mode, c.shape, kKeepFraction);
  std::vector<LayerScores> layers = WideLayers(policy, c);
  auto want = DecideLaProx(policy, layers);
  if (!want.ok()) return absl::StrCat(c.Describe(), ": DecideLaProx: ", want.status().ToString());
  for (size_t l = 0; l < want->size(); ++l) (*want)[l].numerics = layers[l].numerics;
  for (size_t l = 0; l < layers.size(); ++l) {
    const bool keep = c.residence == Residence::kDevice ||
                      (c.residence == Residence::kMixed && l % 2 == 0);
    if (!keep) continue;
    const absl::Status st = SharedGpu().KeepScoresOnDevice(policy, &layers[l]);
    if (!st.ok()) return absl::StrCat(c.Describe(), ": KeepScoresOnDevice: ", st.ToString());
  }
  auto got = SharedGpu().DecideModelWide(policy, layers);
  if (!got.ok()) return absl::StrCat(c.Describe(), ": DecideModelWide: ", got.status().ToString());
  const std::string diff = DecisionsDiff(*want, *got);
  return diff.empty() ? "" : absl::StrCat(c.Describe(), ": ", diff);
}

/// Every case of the grid for `residence`.
std::vector<WideCase> WideGrid(Residence residence) {
  std::vector<WideCase> cases;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, int64_t{40000}}) {
    for (int64_t heads : {int64_t{1}, int64_t{3}, int64_t{8}}) {
      for (const char* mode : {"model", "model_raw", "local", "layer"}) {
        cases.push_back({mode, OutputShape::kPerHead, heads, n, 3, residence});
      }
      cases.push_back({"model", OutputShape::kEqualCount, heads, n, 3, residence});
    }
  }
  return cases;
}

TEST(DeviceModelWide, MatchesDecideLaProx) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (Residence residence : {Residence::kDevice, Residence::kHost, Residence::kMixed}) {
    for (const std::string& failure : RunConcurrently(WideGrid(residence), RunWideCase)) {
      EXPECT_TRUE(failure.empty()) << failure;
    }
  }
}

// One layer alone, and many layers with a single head: the scan over tiles and segments at
// the extremes.
TEST(DeviceModelWide, LayerCountExtremes) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<WideCase> cases;
  for (const char* mode : {"model", "model_raw", "local", "layer"}) {
    cases.push_back({mode, OutputShape::kPerHead, 8, 20000, 1, Residence::kDevice});
    cases.push_back({mode, OutputShape::kPerHead, 1, 300, 40, Residence::kDevice});
  }
  for (const std::string& failure : RunConcurrently(cases, RunWideCase)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// Ties everywhere: every score equal (and all zero), so the whole selection is the tie rule
// (layer order, head, token).
TEST(DeviceModelWide, AllTies) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (float value : {0.0f, 0.25f}) {
    for (const char* mode : {"model", "model_raw", "layer"}) {
      const ResolvedPolicy policy = LaProxPolicy(mode, OutputShape::kPerHead, kKeepFraction);
      std::vector<LayerScores> layers;
      for (int l = 0; l < 4; ++l) {
        layers.push_back(MakeLayer(policy, l, 3, 1000, std::vector<float>(3000, value)));
      }
      auto want = DecideLaProx(policy, layers);
      ASSERT_TRUE(want.ok()) << want.status();
      for (LayerScores& layer : layers) {
        ASSERT_TRUE(SharedGpu().KeepScoresOnDevice(policy, &layer).ok());
      }
      auto got = SharedGpu().DecideModelWide(policy, layers);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(DecisionsDiff(*want, *got), "") << "mode=" << mode << " value=" << value;
    }
  }
}

// ---- Through PolicyEngine, as a session runs them -----------------------------------------------

/// One engine case: laprox in `mode` on `layers` layers of a random model.
struct EngineCase {
  std::string mode;
  DType dtype = DType::kF32;
  int64_t n = 99;
  int32_t layers = 4;
  std::string Describe() const {
    return absl::StrCat("mode=", mode, " dtype=", DTypeName(dtype), " n=", n, " L=", layers);
  }
};

/// Resolves laprox in `mode` with its window lowered to `w` for `engine`, with a random model
/// of `layers` layers (H_kv 3, G 2, d 64, D 64) attached.
absl::StatusOr<ResolvedPolicy> EnginePolicy(const PolicyEngine& engine, const std::string& mode,
                                            int32_t layers, int64_t w) {
  CompressionSettings settings;
  settings.policy = "laprox";
  settings.params["mode"] = ParamValue::Text(mode);
  settings.params["window"] = ParamValue::Number(static_cast<double>(w));
  settings.budget.keep_fraction = kKeepFraction;
  settings.num_layers = layers;
  settings.numerics = Numerics::kExact;
  auto policy = engine.Prepare(settings, "begin");
  if (!policy.ok()) return policy.status();
  TestModelKey key;
  key.kv_heads = 3;
  key.group = 2;
  key.head_dim = 64;
  key.hidden = 64;
  key.layers = layers;
  KVTRIM_RETURN_IF_ERROR(engine.AttachModel(&*policy, TestModel(key), "begin"));
  return policy;
}

/// Scores every layer through `engine` and decides them; the buffered scores are dropped
/// before returning (a finished session).
absl::StatusOr<std::vector<LayerDecision>> EngineSession(const PolicyEngine& engine,
                                                         const EngineCase& c,
                                                         bool expect_resident) {
  const int64_t w = std::min<int64_t>(32, c.n);
  auto policy = EnginePolicy(engine, c.mode, c.layers, w);
  if (!policy.ok()) return policy.status();
  std::vector<LayerScores> buffered;
  for (int32_t l = 0; l < c.layers; ++l) {
    const ModelLayerData data =
        MakeModelLayerData(c.dtype, 3, c.n, 64, 2, w, static_cast<uint64_t>(l * 101 + c.n));
    LayerRequest request;
    request.layer_id = l;
    request.keys = {data.keys.data(), c.dtype, {3, c.n, 64}};
    request.values = {data.values.data(), c.dtype, {3, c.n, 64}};
    request.queries = {data.queries.data(), c.dtype, {6, w, 64}};
    double seconds = 0;
    auto scores = engine.ScoreLayer(*policy, request, absl::StrCat("layers[", l, "]"), &seconds);
    if (!scores.ok()) return scores.status();
    if (expect_resident && (scores->resident == nullptr || !scores->scores.empty())) {
      return absl::InternalError("the GPU engine copied the scores back");
    }
    buffered.push_back(*std::move(scores));
  }
  return engine.DecideModelWide(*policy, buffered);
}

TEST(DeviceModelWide, EngineMatchesCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<EngineCase> cases;
  for (const char* mode : {"model", "model_raw"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t n : {int64_t{99}, int64_t{1000}}) cases.push_back({mode, dtype, n, 4});
    }
  }
  auto run = [](const EngineCase& c) -> std::string {
    PolicyEngine cpu(BuiltinRegistry(), SharedCpu(false, 1));
    PolicyEngine gpu(BuiltinRegistry(), SharedGpu());
    auto want = EngineSession(cpu, c, false);
    if (!want.ok()) return absl::StrCat(c.Describe(), ": CPU: ", want.status().ToString());
    auto got = EngineSession(gpu, c, true);
    if (!got.ok()) return absl::StrCat(c.Describe(), ": GPU: ", got.status().ToString());
    const std::string diff = DecisionsDiff(*want, *got);
    return diff.empty() ? "" : absl::StrCat(c.Describe(), ": ", diff);
  };
  for (const std::string& failure : RunConcurrently(cases, run)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// ---- Memory and ownership ---------------------------------------------------------------------

TEST(DeviceModelWide, ScoreBufferCap) {
  KVTRIM_SKIP_WITHOUT_GPU();
  GpuBackendOptions options;
  options.score_buffer_bytes = 4096;
  auto backend = testing::CreateGpuBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const ResolvedPolicy policy = LaProxPolicy("model", OutputShape::kPerHead, kKeepFraction);
  // [3, 99 - 4 - 8] candidates = 1044 bytes fit; [3, 1000 - 12] = 11856 bytes do not.
  LayerScores small = MakeLayer(policy, 0, 3, 99, SyntheticScores(3, 99, 1));
  ASSERT_TRUE((*backend)->KeepScoresOnDevice(policy, &small).ok());
  EXPECT_EQ((*backend)->score_store().bytes(), 3u * 87u * sizeof(float));
  LayerScores large = MakeLayer(policy, 1, 3, 1000, SyntheticScores(3, 1000, 2));
  const absl::Status st = (*backend)->KeepScoresOnDevice(policy, &large);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("model-wide scores"));
  EXPECT_FALSE(large.scores.empty());  // left as it was
  // The backend still decides, and the memory goes back with the handle.
  std::vector<LayerScores> layers;
  layers.push_back(std::move(small));
  auto decided = (*backend)->DecideModelWide(policy, layers);
  EXPECT_TRUE(decided.ok()) << decided.status();
  layers.clear();
  EXPECT_EQ((*backend)->score_store().bytes(), 0u);
}

TEST(DeviceModelWide, ForeignScores) {
  KVTRIM_SKIP_WITHOUT_GPU();
  auto other = testing::CreateGpuBackend();
  ASSERT_TRUE(other.ok()) << other.status();
  const ResolvedPolicy policy = LaProxPolicy("model", OutputShape::kPerHead, kKeepFraction);
  std::vector<LayerScores> layers;
  layers.push_back(MakeLayer(policy, 0, 3, 99, SyntheticScores(3, 99, 1)));
  ASSERT_TRUE((*other)->KeepScoresOnDevice(policy, &layers[0]).ok());
  auto gpu = SharedGpu().DecideModelWide(policy, layers);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
  EXPECT_THAT(std::string(gpu.status().message()), ::testing::HasSubstr("another backend"));
  auto cpu = SharedCpu(false, 1).DecideModelWide(policy, layers);
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition) << cpu.status();
  // Scores kept for model_raw cannot be decided as mode model (they are not normalised).
  const ResolvedPolicy raw = LaProxPolicy("model_raw", OutputShape::kPerHead, kKeepFraction);
  std::vector<LayerScores> raw_layers;
  raw_layers.push_back(MakeLayer(raw, 0, 3, 99, SyntheticScores(3, 99, 1)));
  ASSERT_TRUE(SharedGpu().KeepScoresOnDevice(raw, &raw_layers[0]).ok());
  auto mixed = SharedGpu().DecideModelWide(policy, raw_layers);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition) << mixed.status();
}

// ---- Timing ---------------------------------------------------------------------------------

// The decision of issue 12's goal: 32 layers x 8 KV heads x 131072 tokens, mode model, scores
// resident. Prints the median wall time of DecideModelWide (no assertion on time) beside the
// host's DecideLaProx, at keep 0.1 (13.4 MB of indices come back) and 0.01 (the selection
// alone, almost), and checks that the answers are equal.
void TimeDecision(double keep_fraction) {
  constexpr int kLayers = 32;
  constexpr int64_t kHeads = 8;
  constexpr int64_t kTokens = 131072;
  const ResolvedPolicy policy = LaProxPolicy("model", OutputShape::kPerHead, keep_fraction);
  std::vector<LayerScores> host;
  for (int l = 0; l < kLayers; ++l) {
    host.push_back(MakeLayer(policy, l, kHeads, kTokens,
                             SyntheticScores(kHeads, kTokens, static_cast<uint64_t>(l) + 11)));
  }
  std::vector<LayerScores> resident = host;
  for (LayerScores& layer : resident) {
    ASSERT_TRUE(SharedGpu().KeepScoresOnDevice(policy, &layer).ok());
  }
  std::vector<double> ms;
  absl::StatusOr<std::vector<LayerDecision>> got;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    got = SharedGpu().DecideModelWide(policy, resident);
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(got.ok()) << got.status();
    if (rep > 0) ms.push_back(elapsed);  // the first call grows the arena and pinned buffer
  }
  std::sort(ms.begin(), ms.end());
  const auto host_start = std::chrono::steady_clock::now();
  auto want = DecideLaProx(policy, host);
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
          .count();
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t l = 0; l < want->size(); ++l) (*want)[l].numerics = host[l].numerics;
  int64_t kept = 0;
  for (const LayerDecision& d : *got) kept += static_cast<int64_t>(d.indices.size());
  std::printf("[ timing ] DecideModelWide 32 layers x 8 heads x 131072, keep %.2f (%lld indices): "
              "GPU median %.3f ms (min %.3f, max %.3f over %zu), host DecideLaProx %.1f ms\n",
              keep_fraction, static_cast<long long>(kept), ms[ms.size() / 2], ms.front(),
              ms.back(), ms.size(), host_ms);
  EXPECT_EQ(DecisionsDiff(*want, *got), "") << "keep " << keep_fraction;
}

TEST(DeviceModelWide, Timing32Layers) {
  KVTRIM_SKIP_WITHOUT_GPU();
  TimeDecision(0.1);
  TimeDecision(0.01);
}

// ---- Small cases for compute-sanitizer ---------------------------------------------------------

TEST(DeviceDecisionSanitizer, ModelWide) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<WideCase> cases;
  for (const char* mode : {"model", "model_raw", "local", "layer"}) {
    cases.push_back({mode, OutputShape::kPerHead, 3, 99, 3, Residence::kMixed});
    cases.push_back({mode, OutputShape::kPerHead, 1, 7, 2, Residence::kDevice});
  }
  cases.push_back({"model", OutputShape::kEqualCount, 3, 99, 2, Residence::kHost});
  for (const WideCase& c : cases) {
    const std::string failure = RunWideCase(c);
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

/// One CompressLayer case on a random model: CPU vs GPU through PolicyEngine.
struct LayerCase {
  std::string label;
  std::string policy;
  OutputShape shape = OutputShape::kPerHead;
  int32_t block_size = 0;
  std::map<std::string, ParamValue> params;
  bool lukv_profile = false;
};

std::string RunLayerCase(const LayerCase& c, int64_t n) {
  constexpr int64_t kHeads = 3;
  const int64_t w = std::min<int64_t>(32, n);
  PolicyEngine cpu(BuiltinRegistry(), SharedCpu(false, 1));
  PolicyEngine gpu(BuiltinRegistry(), SharedGpu());
  CompressionSettings settings;
  settings.policy = c.policy;
  settings.params = c.params;
  settings.output_shape = c.shape;
  settings.block_size = c.block_size;
  settings.budget.keep_fraction = kKeepFraction;
  settings.num_layers = 2;
  settings.numerics = Numerics::kExact;
  auto policy = PrepareForRows(cpu, settings, w);
  if (!policy.ok()) return absl::StrCat(c.label, ": ", policy.status().ToString());
  TestModelKey key;
  key.kv_heads = kHeads;
  key.group = 2;
  key.layers = 2;
  if (c.lukv_profile) key.profile_window = policy->params.Int("window");
  if (auto st = cpu.AttachModel(&*policy, TestModel(key), "settings"); !st.ok()) {
    return absl::StrCat(c.label, ": ", st.ToString());
  }
  const ModelLayerData data = MakeModelLayerData(DType::kF32, kHeads, n, 64, 2, w, 77);
  LayerRequest request;
  request.layer_id = 1;
  request.keys = {data.keys.data(), DType::kF32, {kHeads, n, 64}};
  request.values = {data.values.data(), DType::kF32, {kHeads, n, 64}};
  request.queries = {data.queries.data(), DType::kF32, {kHeads * 2, w, 64}};
  auto want = cpu.CompressLayer(*policy, request, "layer");
  if (!want.ok()) return absl::StrCat(c.label, ": CPU: ", want.status().ToString());
  auto got = gpu.CompressLayer(*policy, request, "layer");
  if (!got.ok()) return absl::StrCat(c.label, ": GPU: ", got.status().ToString());
  const std::string diff = DecisionDiff(*want, *got);
  return diff.empty() ? "" : absl::StrCat(c.label, " n=", n, ": ", diff);
}

/// The host_decide layers EnqueueDecision decides: CriticalKV's stages under every allocator
/// and shape, lukv, block-aligned and equal-count outputs, LaProx on one layer.
std::vector<LayerCase> LayerCases() {
  return {
      {"criticalkv", "criticalkv", OutputShape::kPerHead, 0, {}, false},
      {"criticalkv_adakv", "criticalkv_adakv", OutputShape::kPerHead, 0, {}, false},
      {"criticalkv_pyramid", "criticalkv+pyramid", OutputShape::kPerHead, 0, {}, false},
      {"criticalkv_shared", "criticalkv", OutputShape::kShared, 0, {}, false},
      {"criticalkv_block", "criticalkv", OutputShape::kBlockAligned, 8, {}, false},
      {"criticalkv_adakv_block", "criticalkv_adakv", OutputShape::kBlockAligned, 5, {}, false},
      {"criticalkv_equal", "criticalkv", OutputShape::kEqualCount, 0, {}, false},
      {"lukv", "lukv", OutputShape::kPerHead, 0, {}, true},
      {"lukv_shared", "lukv", OutputShape::kShared, 0, {}, true},
      {"lukv_block", "lukv", OutputShape::kBlockAligned, 16, {}, true},
      {"snapkv_block", "snapkv", OutputShape::kBlockAligned, 16, {}, false},
      {"adakv_equal", "adakv", OutputShape::kEqualCount, 0, {}, false},
      {"laprox_local", "laprox", OutputShape::kPerHead, 0,
       {{"mode", ParamValue::Text("local")}}, false},
      {"laprox_layer", "laprox", OutputShape::kPerHead, 0,
       {{"mode", ParamValue::Text("layer")}}, false},
      {"laprox_model", "laprox", OutputShape::kPerHead, 0,
       {{"mode", ParamValue::Text("model")}}, false},
      {"laprox_equal", "laprox", OutputShape::kEqualCount, 0, {}, false},
  };
}

TEST(DeviceLayerDecision, MatchesCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<std::pair<LayerCase, int64_t>> cases;
  for (const LayerCase& c : LayerCases()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, int64_t{9000}}) {
      cases.push_back({c, n});
    }
  }
  auto run = [](const std::pair<LayerCase, int64_t>& c) { return RunLayerCase(c.first, c.second); };
  for (const std::string& failure : RunConcurrently(cases, run)) {
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

TEST(DeviceDecisionSanitizer, LayerDecisions) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (const LayerCase& c : LayerCases()) {
    const std::string failure = RunLayerCase(c, 99);
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing
