// CPU backend benchmarks: every scorer (+ top-k selection) on one layer, fp32 and bf16
// inputs, fast and exact (the model-aware ones with a Llama-3.1-8B-shaped random model).
// Shape: H_kv = 8, G = 4 (H_q = 32), d = 128, w = 32, fp32, n in {4K, 32K}.
// Reported as tokens/s (n tokens of one layer per iteration, all heads).
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/cpu_backend.h"
#include "base/dtype.h"
#include "kernels/engine.h"
#include "kernels/model.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"

namespace kvtrim {
namespace {

constexpr int64_t kKvHeads = 8;
constexpr int64_t kGroup = 4;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kWindow = 32;

/// Random tensors of one layer, fp32 and the same values rounded to bf16: keys/values
/// [8, n, 128], queries [32, 32, 128].
struct LayerData {
  std::vector<float> keys, values, queries;
  std::vector<uint16_t> keys_bf16, values_bf16, queries_bf16;
  explicit LayerData(int64_t n) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    keys.resize(static_cast<size_t>(kKvHeads * n * kHeadDim));
    values.resize(keys.size());
    queries.resize(static_cast<size_t>(kKvHeads * kGroup * kWindow * kHeadDim));
    for (auto& x : keys) x = normal(rng);
    for (auto& x : values) x = normal(rng);
    for (auto& x : queries) x = normal(rng);
    auto round = [](const std::vector<float>& from, std::vector<uint16_t>* to) {
      to->resize(from.size());
      for (size_t i = 0; i < from.size(); ++i) (*to)[i] = FloatToBf16(from[i]);
    };
    round(keys, &keys_bf16);
    round(values, &values_bf16);
    round(queries, &queries_bf16);
  }
  /// The keys, values and queries in `dtype` (kF32 or kBF16).
  const void* Keys(DType dtype) const {
    return dtype == DType::kF32 ? static_cast<const void*>(keys.data()) : keys_bf16.data();
  }
  const void* Values(DType dtype) const {
    return dtype == DType::kF32 ? static_cast<const void*>(values.data()) : values_bf16.data();
  }
  const void* Queries(DType dtype) const {
    return dtype == DType::kF32 ? static_cast<const void*>(queries.data()) : queries_bf16.data();
  }
};

const LayerData& DataFor(int64_t n) {
  static LayerData small(4096), large(32768);
  return n == 4096 ? small : large;
}

/// The timed loop of a policy row: PolicyEngine::CompressLayer of `layer` (n tokens) with
/// `policy`, reported as tokens/s.
void TimeCompressLayer(benchmark::State& state, const PolicyEngine& engine,
                       const ResolvedPolicy& policy, const LayerRequest& layer, int64_t n) {
  for (auto _ : state) {
    auto decision = engine.CompressLayer(policy, layer, "layer");
    if (!decision.ok()) {
      state.SkipWithError(std::string(decision.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(decision->indices.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

/// Which perturbation statistic a benchmark row asks for.
enum class Stats {
  kOff,      // none: the scorer and the selection alone (the policy rows)
  kFull,     // every window row (sends values and queries whatever the scorer reads)
  kSampled,  // the last rows of each query head (fast numerics; exact computes every row)
};

/// Times PolicyEngine::CompressLayer (validation, scoring, selection; plus the
/// perturbation statistic `stats` asks for) for `policy` on the CPU backend, inputs in
/// `dtype`, asking for `numerics` (computed exact where the scorer has no fast CPU path).
void BM_Policy(benchmark::State& state, const char* policy, Stats stats, DType dtype,
               Numerics numerics) {
  const int64_t n = state.range(0);
  const LayerData& data = DataFor(n);
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend backend(static_cast<int>(std::thread::hardware_concurrency()));
  PolicyEngine engine(registry, backend);
  CompressionSettings settings;
  settings.policy = policy;
  settings.budget.keep_fraction = 0.2;
  settings.numerics = numerics;
  settings.perturbation = stats != Stats::kOff;
  settings.perturbation_sampled = stats == Stats::kSampled;
  const bool with_stats = stats != Stats::kOff;
  auto resolved = engine.Prepare(settings, "settings");
  if (!resolved.ok()) {
    state.SkipWithError(std::string(resolved.status().message()).c_str());
    return;
  }
  const uint32_t needs = resolved->scorer->required_inputs;
  LayerRequest layer;
  layer.keys = {data.Keys(dtype), dtype, {kKvHeads, n, kHeadDim}};
  if (with_stats || (needs & kInputValues)) {
    layer.values = {data.Values(dtype), dtype, {kKvHeads, n, kHeadDim}};
  }
  if (with_stats || (needs & (kInputQueries | kInputValues))) {
    layer.queries = {data.Queries(dtype), dtype, {kKvHeads * kGroup, kWindow, kHeadDim}};
  }
  TimeCompressLayer(state, engine, *resolved, layer, n);
}

// Each policy four times: fp32 inputs ("policy") and bf16 ("policy_bf16"), each asking for
// fast numerics (the default) and for the canonical arithmetic ("..._exact").
#define KVTRIM_POLICY_RUN(name, policy, dtype, numerics)                               \
  BENCHMARK_CAPTURE(BM_Policy, name, #policy, Stats::kOff, dtype, numerics)                  \
      ->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)
#define KVTRIM_POLICY_BENCH(policy)                                                    \
  KVTRIM_POLICY_RUN(policy, policy, DType::kF32, Numerics::kFast);                     \
  KVTRIM_POLICY_RUN(policy##_exact, policy, DType::kF32, Numerics::kExact);            \
  KVTRIM_POLICY_RUN(policy##_bf16, policy, DType::kBF16, Numerics::kFast);             \
  KVTRIM_POLICY_RUN(policy##_bf16_exact, policy, DType::kBF16, Numerics::kExact)

KVTRIM_POLICY_BENCH(streaming_llm);
KVTRIM_POLICY_BENCH(random);
KVTRIM_POLICY_BENCH(knorm);
KVTRIM_POLICY_BENCH(keydiff);
KVTRIM_POLICY_BENCH(snapkv);
KVTRIM_POLICY_BENCH(h2o);
KVTRIM_POLICY_BENCH(tova);
KVTRIM_POLICY_BENCH(dropkv);
KVTRIM_POLICY_BENCH(pyramidkv);
KVTRIM_POLICY_BENCH(adakv);
// The perturbation statistic's cost on top of the policy: DropKV (fast full and sampled,
// exact full, fp32 and bf16) and SnapKV (fast full; values sent for the statistic alone).
#define KVTRIM_STATS_RUN(name, policy, stats, dtype, numerics)                          \
  BENCHMARK_CAPTURE(BM_Policy, name, #policy, stats, dtype, numerics)                  \
      ->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)
KVTRIM_STATS_RUN(dropkv_perturbation_full, dropkv, Stats::kFull, DType::kF32, Numerics::kFast);
KVTRIM_STATS_RUN(dropkv_perturbation_sampled, dropkv, Stats::kSampled, DType::kF32,
                 Numerics::kFast);
KVTRIM_STATS_RUN(dropkv_perturbation_full_exact, dropkv, Stats::kFull, DType::kF32,
                 Numerics::kExact);
KVTRIM_STATS_RUN(dropkv_perturbation_full_bf16, dropkv, Stats::kFull, DType::kBF16,
                 Numerics::kFast);
KVTRIM_STATS_RUN(snapkv_perturbation_full, snapkv, Stats::kFull, DType::kF32, Numerics::kFast);

/// The Llama-3.1-8B-shaped random model of the model-aware rows (one layer: W_O [4096,
/// 4096] f32 N(0, 0.3^2), its Gram matrices, query statistics), built once.
std::shared_ptr<const RegisteredModel> BenchModel() {
  static const std::shared_ptr<const RegisteredModel> model = [] {
    RandomModelOptions o;
    o.layers = 1;
    o.query_heads = kKvHeads * kGroup;
    o.kv_heads = kKvHeads;
    o.head_dim = kHeadDim;
    o.hidden = 4096;
    o.query_stats = true;
    return RandomModel(o);
  }();
  return model;
}

/// Times PolicyEngine::CompressLayer for a model-aware `policy` with `params` ("name=value"
/// pairs, comma-separated; "" for the defaults) and BenchModel attached, on the CPU backend
/// (every core), keys, values and queries in `dtype`, in `numerics`. Layer 0 of one layer.
void BM_ModelPolicy(benchmark::State& state, const char* policy, const char* params,
                    DType dtype, Numerics numerics) {
  const int64_t n = state.range(0);
  const LayerData& data = DataFor(n);
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend backend(static_cast<int>(std::thread::hardware_concurrency()));
  PolicyEngine engine(registry, backend);
  CompressionSettings settings;
  settings.policy = policy;
  settings.budget.keep_fraction = 0.2;
  settings.numerics = numerics;
  settings.perturbation = false;  // the scorer and the selection alone, as the policy rows
  settings.num_layers = 1;
  for (absl::string_view pair : absl::StrSplit(params, ',', absl::SkipEmpty())) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(pair, '=');
    settings.params[kv.first] = ParamValue::Text(kv.second);
  }
  auto resolved = engine.Prepare(settings, "settings");
  absl::Status st = resolved.status();
  if (st.ok()) st = engine.AttachModel(&*resolved, BenchModel(), "settings");
  if (!st.ok()) {
    state.SkipWithError(std::string(st.message()).c_str());
    return;
  }
  LayerRequest layer;
  layer.layer_id = 0;
  layer.keys = {data.Keys(dtype), dtype, {kKvHeads, n, kHeadDim}};
  layer.values = {data.Values(dtype), dtype, {kKvHeads, n, kHeadDim}};
  layer.queries = {data.Queries(dtype), dtype, {kKvHeads * kGroup, kWindow, kHeadDim}};
  TimeCompressLayer(state, engine, *resolved, layer, n);
}

// The model-aware policies (Llama-3.1-8B-shaped W_O, D = 4096), fast and exact at 4K and 32K
// in fp32 and bf16 (CriticalKV l1's canonical o_proj products take minutes at 32K). LaProx
// runs its per-layer top-K (mode=layer): its default model-wide decision answers at the end
// of a session.
#define KVTRIM_MODEL_RUN(name, policy, params, dtype, numerics, ...)                     \
  BENCHMARK_CAPTURE(BM_ModelPolicy, name, #policy, params, dtype, numerics)            \
      __VA_ARGS__->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5)
#define KVTRIM_MODEL_BENCH(name, policy, params)                                         \
  KVTRIM_MODEL_RUN(name, policy, params, DType::kF32, Numerics::kFast, ->Arg(4096)->Arg(32768)); \
  KVTRIM_MODEL_RUN(name##_bf16, policy, params, DType::kBF16, Numerics::kFast,          \
                   ->Arg(4096)->Arg(32768));                                              \
  KVTRIM_MODEL_RUN(name##_exact, policy, params, DType::kF32, Numerics::kExact,         \
                   ->Arg(4096)->Arg(32768));                                              \
  KVTRIM_MODEL_RUN(name##_bf16_exact, policy, params, DType::kBF16, Numerics::kExact,   \
                   ->Arg(4096)->Arg(32768))

KVTRIM_MODEL_BENCH(criticalkv, criticalkv, "");
KVTRIM_MODEL_BENCH(criticalkv_l2, criticalkv, "norm=l2");
KVTRIM_MODEL_BENCH(laprox_layer, laprox, "mode=layer");
KVTRIM_MODEL_BENCH(expected_attention, expected_attention, "");

/// RegisterModel's build of `layers` Llama-3.1-8B-shaped layers (W_O [4096, 4096] f32, H_q =
/// 32, H_kv = 8, d = 128): the f32 conversion and the fp64 per-head and per-group Gram
/// matrices, spread over the host's cores.
void BM_BuildModel(benchmark::State& state) {
  RandomModelOptions o;
  o.layers = static_cast<int32_t>(state.range(0));
  o.query_heads = 32;
  o.kv_heads = 8;
  o.head_dim = 128;
  o.hidden = 4096;
  const ModelInput input = RandomModelInput(o);
  for (auto _ : state) {
    auto model = BuildModelFrom(input);
    if (!model.ok()) state.SkipWithError(std::string(model.status().message()).c_str());
    benchmark::DoNotOptimize(model);
  }
  state.counters["layers_per_s"] = benchmark::Counter(
      static_cast<double>(o.layers), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_BuildModel)->Arg(1)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace kvtrim

BENCHMARK_MAIN();
