// kvtrim_gpu_bench: every preset's scorer + selection on the GPU, timed with CUDA events on
// device-resident inputs, beside the device-to-device copy bandwidth of the same run.
//
// Shape (issue "Benchmarks"): H_kv = 8, G = 4 (H_q = 32), d = 128, bf16, batch 1,
// n in {4096, 32768, 131072}, w in {8, 32} query rows; keep_fraction 0.1; layer 16 of 32
// (PyramidKV). Window parameters above w are lowered to w (SnapKV's 32 at w = 8).
// Per configuration: warm-up, then >= 20 timed repetitions rotating over enough input sets
// to exceed 4x the L2 cache (at least 2), median of each phase:
//   score  = LaunchScore + NaN probe + protection,
//   select = AdaKV counts (adakv) + per-head top-k,
//   total  = score + select (the perturbation statistic is off: it is not part of a policy).
// bytes = K, V (only when the scorer reads V) and Q, each read once; GB/s = bytes / time.
// scratch = device bytes of one layer request beyond its inputs (scores, counts, offsets,
// indices, launcher scratch), as GpuBackend's arena holds them.
// copy GB/s = (bytes read + bytes written) / time of a cudaMemcpy device-to-device.
//
// Model-aware presets (criticalkv, criticalkv_adakv, laprox, expected_attention, lukv) run at
// the issue-3 shapes only: w = 32, n in --model_n (default 32768, 131072), hidden D = 4096, on
// random device-resident model tensors (W_O / Gram matrices lane-major fp32, EA statistics in
// the arena) and a host model stub carrying a random snapkv LU-KV profile. Host-decided
// presets (criticalkv*, lukv) time the device scoring with events and the host part (scores
// copied back, then kernels/decide.h DecideLayer) with the host clock: select = copy + decide.
// laprox times the per-layer score kernel; the row "laprox_decide32" times the host
// DecideLaProx (mode model) over 32 layers of [8, n] scores, and "ea_stats_host" the host
// ComputeExpectedQueryStats of one layer (query_stats model).
//
// Usage: kvtrim_gpu_bench [--out=DIR] [--reps=25] [--warmup=3] [--n=4096,32768,131072]
//                         [--w=8,32] [--policies=a,b] [--copy_mib=1024]
//                         [--model_n=32768,131072] [--hidden=4096] [--host_reps=3]
// Writes DIR/gpu_bench.json and DIR/gpu_bench.csv (DIR default "out"); prints a table.
// Exit status: 0 when every configuration ran and its answer is well formed (offsets, and
// lists strictly ascending in [0, n)), 1 otherwise,
// 2 for a bad flag.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include <chrono>
#include <memory>

#include "kernels/bench/gpu_bench_fill.h"
#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/decide.h"
#include "kernels/expected_attention_stats.h"
#include "kernels/gpu/device_error.h"
#include "kernels/gpu/device_pipeline.h"
#include "kernels/gpu/device_probe.h"
#include "kernels/registry.h"
#include "nlohmann/json.hpp"

namespace kvtrim::gpu::bench {
namespace {

constexpr int64_t kKvHeads = 8;
constexpr int64_t kGroup = 4;
constexpr int64_t kHeadDim = 128;
constexpr int32_t kLayerId = 16;
constexpr int32_t kNumLayers = 32;
constexpr DType kDType = DType::kBF16;

/// Command-line options.
struct Options {
  std::string out_dir = "out";
  int reps = 25;
  int warmup = 3;
  std::vector<int64_t> ns = {4096, 32768, 131072};
  std::vector<int64_t> windows = {8, 32};
  std::vector<std::string> policies;  // empty = every preset
  int64_t copy_mib = 1024;
  double keep_fraction = 0.1;
  std::vector<int64_t> model_ns = {32768, 131072};  // model-aware presets (w = 32)
  int64_t model_w = 32;
  int64_t hidden = 4096;
  int host_reps = 3;  // host-only rows (DecideLaProx over 32 layers, EA statistics)
};

/// One measured configuration.
struct Row {
  std::string policy, scorer;
  int64_t n = 0, w = 0;
  int64_t bytes = 0;         // K + V (if read) + Q, once
  double score_us = 0, select_us = 0, total_us = 0;
  double score_gbps = 0, total_gbps = 0;
  int64_t scratch_bytes = 0;
  int input_sets = 0;
  std::string error;         // empty when the configuration ran and checked out
  std::string note;          // how the row was measured, when not the default
};

bool ParseList(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) return false;
    out->push_back(v);
  }
  return !out->empty();
}

/// Parses argv; returns false (after printing why) on a bad flag.
bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (name == "--out") {
      o->out_dir = value;
    } else if (name == "--reps") {
      ok = ok && absl::SimpleAtoi(value, &o->reps) && o->reps >= 20;
    } else if (name == "--warmup") {
      ok = ok && absl::SimpleAtoi(value, &o->warmup) && o->warmup >= 1;
    } else if (name == "--n") {
      ok = ok && ParseList(value, &o->ns);
    } else if (name == "--w") {
      ok = ok && ParseList(value, &o->windows);
    } else if (name == "--policies") {
      o->policies = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (name == "--copy_mib") {
      ok = ok && absl::SimpleAtoi(value, &o->copy_mib) && o->copy_mib >= 1024;
    } else if (name == "--model_n") {
      ok = ok && ParseList(value, &o->model_ns);
    } else if (name == "--hidden") {
      ok = ok && absl::SimpleAtoi(value, &o->hidden) && o->hidden >= 1;
    } else if (name == "--host_reps") {
      ok = ok && absl::SimpleAtoi(value, &o->host_reps) && o->host_reps >= 1;
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "kvtrim_gpu_bench: bad flag '" << arg
                << "' (--out=DIR --reps>=20 --warmup>=1 --n=LIST --w=LIST --policies=LIST "
                   "--copy_mib>=1024 --model_n=LIST --hidden>=1 --host_reps>=1)\n";
      return false;
    }
  }
  return true;
}

/// Device-resident K/V/Q of one input set.
struct InputSet {
  DeviceBuffer keys, values, queries;
};

/// The model of the model-aware presets: random lane-major device tensors of one layer
/// (their values only set the arithmetic's magnitudes) and a host stub with the layout and a
/// random snapkv LU-KV profile (sink 0, window 32).
struct BenchModel {
  std::shared_ptr<RegisteredModel> host;
  DeviceBuffer w_o, head_gram, group_gram;
};

/// Fast deterministic uniforms in [0, 1) (host).
float HostUniform(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<float>(static_cast<double>(*state >> 40) / 16777216.0);
}

absl::Status MakeBenchModel(const Options& o, cudaStream_t stream, BenchModel* m) {
  const int64_t hq = kKvHeads * kGroup;
  const int64_t vf = LaneMajorFloats(kHeadDim);
  auto model = std::make_shared<RegisteredModel>();
  model->digest = "sha256:bench";
  model->layout = {"bench", kNumLayers, static_cast<int32_t>(hq), static_cast<int32_t>(kKvHeads),
                   static_cast<int32_t>(kHeadDim), static_cast<int32_t>(o.hidden)};
  LukvProfile profile;
  profile.name = profile.metric = "snapkv";
  profile.sink = 0;
  profile.window = o.model_w;
  profile.prune_ratios.resize(static_cast<size_t>(kLukvProfileRows * kNumLayers * kKvHeads));
  uint64_t state = 17;
  for (int64_t r = 0; r < kLukvProfileRows; ++r) {
    for (int64_t i = 0; i < kNumLayers * kKvHeads; ++i) {
      const float f = 0.5f + HostUniform(&state);
      profile.prune_ratios[static_cast<size_t>(r * kNumLayers * kKvHeads + i)] =
          std::min(1.0f, static_cast<float>(r + 1) / 100.0f * f);
    }
  }
  model->profiles["snapkv"] = std::move(profile);
  // Pre-RoPE query statistics of every layer (ea_stats_host row).
  model->query_mean.assign(static_cast<size_t>(kNumLayers),
                           std::vector<float>(static_cast<size_t>(hq * kHeadDim)));
  model->query_cov.assign(static_cast<size_t>(kNumLayers),
                          std::vector<float>(static_cast<size_t>(hq * kHeadDim * kHeadDim)));
  for (auto& layer : model->query_mean) for (float& x : layer) x = HostUniform(&state) - 0.5f;
  for (auto& layer : model->query_cov) for (float& x : layer) x = 0.05f * (HostUniform(&state) - 0.5f);
  m->host = model;
  const size_t w_o_count = static_cast<size_t>(hq * o.hidden * vf);
  const size_t head_count = static_cast<size_t>(hq * kHeadDim * vf);
  const size_t group_count = static_cast<size_t>(kKvHeads * kHeadDim * vf);
  KVTRIM_RETURN_IF_ERROR(m->w_o.Allocate(w_o_count * sizeof(float)));
  KVTRIM_RETURN_IF_ERROR(m->head_gram.Allocate(head_count * sizeof(float)));
  KVTRIM_RETURN_IF_ERROR(m->group_gram.Allocate(group_count * sizeof(float)));
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(o.hidden));
  KVTRIM_CUDA_RETURN_IF_ERROR(LaunchFillPseudoNormal(m->w_o.get(), DType::kF32,
                                                     static_cast<int64_t>(w_o_count), 71, w_scale,
                                                     stream),
                              "fill w_o");
  KVTRIM_CUDA_RETURN_IF_ERROR(LaunchFillPseudoNormal(m->head_gram.get(), DType::kF32,
                                                     static_cast<int64_t>(head_count), 72, 0.05f,
                                                     stream),
                              "fill head_gram");
  KVTRIM_CUDA_RETURN_IF_ERROR(LaunchFillPseudoNormal(m->group_gram.get(), DType::kF32,
                                                     static_cast<int64_t>(group_count), 73, 0.05f,
                                                     stream),
                              "fill group_gram");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "fill model");
  return absl::OkStatus();
}

/// "" when offsets [lists + 1] and indices are well formed (every list strictly ascending in
/// [0, n), the offsets ending at `expected_total` unless it is negative).
std::string CheckAnswer(const std::vector<int64_t>& offsets, const std::vector<int32_t>& indices,
                        int64_t n, int64_t expected_total) {
  if (offsets.empty() || offsets.front() != 0 ||
      (expected_total >= 0 && offsets.back() != expected_total) ||
      offsets.back() != static_cast<int64_t>(indices.size())) {
    return absl::StrCat("offsets end at ", offsets.empty() ? -1 : offsets.back(), ", expected ",
                        expected_total >= 0 ? expected_total
                                            : static_cast<int64_t>(indices.size()));
  }
  for (size_t l = 0; l + 1 < offsets.size(); ++l) {
    for (int64_t i = offsets[l]; i < offsets[l + 1]; ++i) {
      const int32_t j = indices[static_cast<size_t>(i)];
      if (j < 0 || j >= n || (i > offsets[l] && j <= indices[static_cast<size_t>(i - 1)])) {
        return absl::StrCat("list ", l, " is not strictly ascending in [0, n) at ", i - offsets[l]);
      }
    }
  }
  return "";
}

/// Host-only rows at n: DecideLaProx (mode model) over kNumLayers layers of random scores, and
/// ComputeExpectedQueryStats of one layer; median of options.host_reps.
std::vector<Row> RunHostRows(const PolicyRegistry& registry, const BenchModel& model, int64_t n,
                             const Options& options) {
  std::vector<Row> rows;
  auto median_ms = [&](const std::function<void()>& fn) {
    std::vector<double> ms;
    for (int rep = 0; rep < options.host_reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count());
    }
    return Median(ms);
  };
  {
    Row row;
    row.policy = "laprox_decide32";
    row.scorer = "laprox";
    row.n = n;
    row.w = options.model_w;
    row.note = absl::StrCat("host DecideLaProx (mode model) over ", kNumLayers, " layers");
    CompressionSettings settings;
    settings.policy = "laprox";
    settings.budget.keep_fraction = options.keep_fraction;
    settings.num_layers = kNumLayers;
    auto policy = registry.Resolve(settings, "settings");
    if (!policy.ok()) {
      row.error = policy.status().ToString();
      rows.push_back(row);
      return rows;
    }
    policy->model = model.host;
    std::vector<LayerScores> layers(static_cast<size_t>(kNumLayers));
    uint64_t state = static_cast<uint64_t>(n);
    for (int32_t l = 0; l < kNumLayers; ++l) {
      LayerScores& ls = layers[static_cast<size_t>(l)];
      ls.layer_id = l;
      ls.num_layers = kNumLayers;
      ls.num_heads = kKvHeads;
      ls.num_tokens = n;
      ls.scores.resize(static_cast<size_t>(kKvHeads * n));
      for (float& x : ls.scores) x = HostUniform(&state);
      ls.budget.kept_per_head = KeptCount(policy->settings.budget, n);
      ls.budget.requested = Protection{0, options.model_w};
      ls.budget.protection =
          ClampProtection(ls.budget.requested, ls.budget.kept_per_head, n);
    }
    absl::Status status;
    row.select_us = 1e3 * median_ms([&] {
      auto decisions = DecideLaProx(*policy, layers);
      if (!decisions.ok()) {
        status = decisions.status();
        return;
      }
      for (const LayerDecision& d : *decisions) {
        if (std::string e = CheckAnswer(d.offsets, d.indices, n, -1); !e.empty()) {
          status = absl::InternalError(e);
        }
      }
    });
    row.total_us = row.select_us;
    if (!status.ok()) row.error = status.ToString();
    rows.push_back(row);
  }
  {
    Row row;
    row.policy = "ea_stats_host";
    row.scorer = "expected_attention";
    row.n = n;
    row.w = options.model_w;
    row.note = "host ComputeExpectedQueryStats of one layer (query_stats model)";
    CompressionSettings settings;
    settings.policy = "expected_attention";
    settings.params["query_stats"] = ParamValue::Text("model");
    auto policy = registry.Resolve(settings, "settings");
    if (!policy.ok()) {
      row.error = policy.status().ToString();
      rows.push_back(row);
      return rows;
    }
    absl::Status status;
    const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    row.select_us = 1e3 * median_ms([&] {
      auto stats = ComputeExpectedQueryStats(*model.host, policy->params, kLayerId, n,
                                             TensorView(), scale);
      if (!stats.ok()) status = stats.status();
    });
    row.total_us = row.select_us;
    if (!status.ok()) row.error = status.ToString();
    rows.push_back(row);
  }
  return rows;
}

/// Measures one preset at (n, w).
Row RunConfig(const PolicyRegistry& registry, const std::string& preset, int64_t n, int64_t w,
              const Options& options, cudaStream_t stream, size_t l2_bytes,
              const BenchModel& model) {
  Row row;
  row.policy = preset;
  row.n = n;
  row.w = w;
  CompressionSettings settings;
  settings.policy = preset;
  settings.budget.keep_fraction = options.keep_fraction;
  settings.num_layers = kNumLayers;
  settings.seed = 3;
  auto probe = registry.Resolve(settings, "settings");
  if (!probe.ok()) {
    row.error = probe.status().ToString();
    return row;
  }
  if (probe->params.Has("window") && probe->params.Int("window") > w) {
    settings.params["window"] = ParamValue::Number(static_cast<double>(w));
  }
  auto policy = registry.Resolve(settings, "settings");
  if (!policy.ok()) {
    row.error = policy.status().ToString();
    return row;
  }
  row.scorer = policy->scorer->name;
  const uint32_t needs = policy->scorer->required_inputs;
  if ((needs | policy->allocator->required_inputs) & kInputModel) policy->model = model.host;

  LayerShape shape;
  shape.num_kv_heads = kKvHeads;
  shape.num_tokens = n;
  shape.head_dim = kHeadDim;
  shape.has_values = (needs & kInputValues) != 0;
  shape.has_queries = (needs & kInputQueries) != 0;
  shape.num_query_heads = shape.has_queries ? kKvHeads * kGroup : 0;
  shape.window_rows = shape.has_queries ? w : 0;
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy->settings.budget, n);
  budget.requested = policy->scorer->default_protection(policy->params, budget.kept_per_head);
  budget.protection = ClampProtection(budget.requested, budget.kept_per_head, n);
  auto plan = PlanLayer(*policy, shape, kDType, kLayerId, kNumLayers, budget);
  if (!plan.ok()) {
    row.error = plan.status().ToString();
    return row;
  }
  plan->perturbation = false;  // a statistic, not part of the policy's decision
  plan->reads_values = shape.has_values;
  plan->reads_queries = shape.has_queries;

  const size_t elem = DTypeSize(kDType);
  const size_t kv_bytes = static_cast<size_t>(kKvHeads * n * kHeadDim) * elem;
  const size_t q_bytes = static_cast<size_t>(kKvHeads * kGroup * w * kHeadDim) * elem;
  const size_t key_read = (row.scorer == "streaming_llm" || row.scorer == "random") ? 0 : kv_bytes;
  row.bytes = static_cast<int64_t>(key_read + (shape.has_values ? kv_bytes : 0) +
                                   (shape.has_queries ? q_bytes : 0));
  const size_t set_bytes = kv_bytes * (shape.has_values ? 2 : 1) + q_bytes;
  row.input_sets = static_cast<int>(
      std::clamp<size_t>((4 * l2_bytes + set_bytes - 1) / set_bytes, 2, 64));

  // Inputs, filled on the device.
  std::vector<InputSet> sets(static_cast<size_t>(row.input_sets));
  for (size_t s = 0; s < sets.size(); ++s) {
    const uint64_t seed = 1000 * (s + 1);
    absl::Status st = sets[s].keys.Allocate(kv_bytes);
    if (st.ok()) st = CudaStatus(LaunchFillPseudoNormal(sets[s].keys.get(), kDType, kv_bytes / elem,
                                                        seed, 1.0f, stream), "fill keys");
    if (st.ok() && shape.has_values) {
      st = sets[s].values.Allocate(kv_bytes);
      if (st.ok()) st = CudaStatus(LaunchFillPseudoNormal(sets[s].values.get(), kDType,
                                                          kv_bytes / elem, seed + 1, 1.0f, stream),
                                   "fill values");
    }
    if (st.ok() && shape.has_queries) {
      st = sets[s].queries.Allocate(q_bytes);
      if (st.ok()) st = CudaStatus(LaunchFillPseudoNormal(sets[s].queries.get(), kDType,
                                                          q_bytes / elem, seed + 2, 1.5f, stream),
                                   "fill queries");
    }
    if (!st.ok()) {
      row.error = st.ToString();
      return row;
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  auto layer_of = [&](const InputSet& s) {
    return MakeDeviceLayer(*plan, shape, kDType, scale, kLayerId, settings.seed, s.keys.get(),
                           s.values.get(), s.queries.get());
  };

  // Working regions (one set; every repetition overwrites them).
  ArenaLayout layout;
  const PipelineRegions regions = AddPipelineRegions(*plan, layer_of(sets[0]), &layout);
  row.scratch_bytes = static_cast<int64_t>(layout.total());
  DeviceBuffer work;
  absl::Status st = work.Allocate(layout.total());
  PipelineBuffers buffers = ResolveBuffers(*plan, regions, work.get());
  buffers.model.w_o = static_cast<const float*>(model.w_o.get());
  buffers.model.head_gram = static_cast<const float*>(model.head_gram.get());
  buffers.model.group_gram = static_cast<const float*>(model.group_gram.get());
  buffers.model.hidden = static_cast<int32_t>(options.hidden);
  buffers.model.half_scale2 = 0.5f / static_cast<float>(kHeadDim);
  if (st.ok() && plan->needs_ea_stats) {  // random statistics in the arena regions
    const int64_t vf = LaneMajorFloats(kHeadDim);
    const int64_t hq = plan->model_query_heads;
    st = CudaStatus(LaunchFillPseudoNormal(const_cast<float*>(buffers.model.ea_mean), DType::kF32,
                                           hq * vf, 81, 1.0f, stream),
                    "fill ea_mean");
    if (st.ok()) {
      st = CudaStatus(LaunchFillPseudoNormal(const_cast<float*>(buffers.model.ea_cov), DType::kF32,
                                             hq * kHeadDim * vf, 82, 0.05f, stream),
                      "fill ea_cov");
    }
  }
  const std::vector<int64_t> meta = MetaInit(*plan);
  if (st.ok()) {
    st = CudaStatus(cudaMemcpyAsync(buffers.counts, meta.data(), meta.size() * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream),
                    "upload meta");
  }
  if (st.ok()) st = CudaStatus(cudaStreamSynchronize(stream), "fill");
  if (!st.ok()) {
    row.error = st.ToString();
    return row;
  }

  PhaseTimer timer;
  if (st = timer.Init(); !st.ok()) {
    row.error = st.ToString();
    return row;
  }
  // Host-decided presets: pinned buffers for the scores coming back.
  const bool host_decide = plan->host_decide;
  const bool score_only = plan->scorer == ScorerKind::kLaProx;  // decided model-wide (host row)
  const size_t score_count = static_cast<size_t>(kKvHeads * n);
  float* pinned = nullptr;
  if (host_decide && !score_only) {
    st = CudaStatus(cudaMallocHost(&pinned, 2 * score_count * sizeof(float)), "cudaMallocHost");
    if (!st.ok()) {
      row.error = st.ToString();
      return row;
    }
  }
  struct PinnedFree {
    float* p;
    ~PinnedFree() {
      if (p != nullptr) cudaFreeHost(p);
    }
  } pinned_free{pinned};
  if (host_decide) {
    row.note = score_only ? "score kernel only (selection: laprox_decide32)"
                          : "select = scores to host + DecideLayer (host clock)";
  }
  LayerDecision host_decision;
  std::vector<double> score_ms, select_ms, total_ms;
  for (int rep = 0; rep < options.warmup + options.reps; ++rep) {
    const InputSet& set = sets[static_cast<size_t>(rep) % sets.size()];
    PhaseTimes times;
    st = timer.Time(stream, &times, [&](const PipelineEvents& events) {
      if (!host_decide) return EnqueueLayer(*plan, layer_of(set), buffers, stream, &events);
      KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(*plan, layer_of(set), buffers, stream));
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.after_score, stream), "cudaEventRecord");
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.after_select, stream), "cudaEventRecord");
      return absl::OkStatus();
    });
    if (st.ok() && host_decide && !score_only) {
      const auto t0 = std::chrono::steady_clock::now();
      st = CudaStatus(cudaMemcpyAsync(pinned, buffers.scores, score_count * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream),
                      "download scores");
      if (st.ok() && plan->critical) {
        st = CudaStatus(cudaMemcpyAsync(pinned + score_count, buffers.critical,
                                        score_count * sizeof(float), cudaMemcpyDeviceToHost,
                                        stream),
                        "download critical");
      }
      if (st.ok()) st = CudaStatus(cudaStreamSynchronize(stream), "download");
      if (st.ok()) {
        std::vector<float> scores(pinned, pinned + score_count);
        std::vector<float> critical;
        if (plan->critical) critical.assign(pinned + score_count, pinned + 2 * score_count);
        st = DecideOnHost(*policy, *plan, kLayerId, kNumLayers, budget, std::move(scores),
                          std::move(critical), &host_decision);
      }
      const double host_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      times.select_ms = host_ms;
      times.total_ms = times.score_ms + host_ms;
    }
    if (!st.ok()) {
      row.error = st.ToString();
      return row;
    }
    if (rep < options.warmup) continue;
    score_ms.push_back(times.score_ms);
    select_ms.push_back(times.select_ms);
    total_ms.push_back(times.total_ms);
  }
  if (host_decide) {
    if (!score_only) row.error = CheckAnswer(host_decision.offsets, host_decision.indices, n, -1);
    row.score_us = 1e3 * Median(score_ms);
    row.select_us = 1e3 * Median(select_ms);
    row.total_us = 1e3 * Median(total_ms);
    row.score_gbps = row.bytes > 0 ? static_cast<double>(row.bytes) / (row.score_us * 1e3) : 0;
    row.total_gbps = row.bytes > 0 ? static_cast<double>(row.bytes) / (row.total_us * 1e3) : 0;
    return row;
  }
  // The answer must be well formed: offsets [H + 1] ending at the planned total, and every
  // list strictly ascending inside [0, n) (a cheap check that catches unwritten slots).
  std::vector<int64_t> offsets(static_cast<size_t>(plan->num_lists()) + 1);
  std::vector<int32_t> indices(static_cast<size_t>(plan->total_indices));
  st = CudaStatus(cudaMemcpy(offsets.data(), buffers.offsets, offsets.size() * sizeof(int64_t),
                             cudaMemcpyDeviceToHost),
                  "download offsets");
  if (st.ok()) {
    st = CudaStatus(cudaMemcpy(indices.data(), buffers.indices, indices.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost),
                    "download indices");
  }
  if (!st.ok()) {
    row.error = st.ToString();
    return row;
  }
  row.error = CheckAnswer(offsets, indices, n, plan->total_indices);
  row.score_us = 1e3 * Median(score_ms);
  row.select_us = 1e3 * Median(select_ms);
  row.total_us = 1e3 * Median(total_ms);
  row.score_gbps = row.bytes > 0 ? static_cast<double>(row.bytes) / (row.score_us * 1e3) : 0;
  row.total_gbps = row.bytes > 0 ? static_cast<double>(row.bytes) / (row.total_us * 1e3) : 0;
  return row;
}

nlohmann::json RowJson(const Row& r, double copy_gbps) {
  nlohmann::json j;
  j["policy"] = r.policy;
  j["scorer"] = r.scorer;
  j["n"] = r.n;
  j["w"] = r.w;
  j["h_kv"] = kKvHeads;
  j["group"] = kGroup;
  j["d"] = kHeadDim;
  j["dtype"] = DTypeName(kDType);
  j["bytes_read"] = r.bytes;
  j["score_us"] = r.score_us;
  j["select_us"] = r.select_us;
  j["total_us"] = r.total_us;
  j["score_gbps"] = r.score_gbps;
  j["total_gbps"] = r.total_gbps;
  j["score_copy_fraction"] = copy_gbps > 0 ? r.score_gbps / copy_gbps : 0;
  j["total_copy_fraction"] = copy_gbps > 0 ? r.total_gbps / copy_gbps : 0;
  j["select_share"] = r.total_us > 0 ? r.select_us / r.total_us : 0;
  j["scratch_bytes"] = r.scratch_bytes;
  j["input_sets"] = r.input_sets;
  j["error"] = r.error;
  j["note"] = r.note;
  return j;
}

int Main(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, &options)) return 2;
  const DeviceCensus census = CountCudaDevices();
  if (census.count == 0) {
    std::cerr << "kvtrim_gpu_bench: no CUDA device (" << census.reason << ")\n";
    return 1;
  }
  cudaDeviceProp prop{};
  if (auto st = CudaStatus(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      !st.ok()) {
    std::cerr << "kvtrim_gpu_bench: " << st << "\n";
    return 1;
  }
  cudaStream_t stream = nullptr;
  if (auto st = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                           "cudaStreamCreate");
      !st.ok()) {
    std::cerr << "kvtrim_gpu_bench: " << st << "\n";
    return 1;
  }
  const std::string device = DescribeCudaDevice(0);
  std::printf("kvtrim_gpu_bench on %s, L2 %.0f MB\n", device.c_str(), prop.l2CacheSize / 1e6);

  auto copy = MeasureCopyBandwidth(static_cast<size_t>(options.copy_mib) << 20, options.reps,
                                   stream);
  if (!copy.ok()) {
    std::cerr << "kvtrim_gpu_bench: copy bandwidth: " << copy.status() << "\n";
    return 1;
  }
  std::printf("device-to-device copy: %.1f GB/s (read + write of %lld MiB, median of %d)\n\n",
              *copy, static_cast<long long>(options.copy_mib), options.reps);

  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  BenchModel model;
  if (auto st = MakeBenchModel(options, stream, &model); !st.ok()) {
    std::cerr << "kvtrim_gpu_bench: model tensors: " << st << "\n";
    return 1;
  }
  std::vector<std::string> presets = options.policies;
  if (presets.empty()) {
    for (const auto& p : registry.presets()) presets.push_back(p.name);
  }
  std::printf("%-16s %7s %3s %10s %10s %10s %9s %6s %6s %10s %s\n", "policy", "n", "w",
              "score_us", "select_us", "total_us", "GB/s", "%copy", "%sel", "scratch_MB",
              "note");
  std::vector<Row> rows;
  bool all_ok = true;
  auto print = [&](Row r) {
    all_ok = all_ok && r.error.empty();
    const std::string note = !r.error.empty() ? r.error
                             : !r.note.empty() ? r.note
                             : r.bytes ? ""
                                       : "reads no tensor";
    std::printf("%-16s %7lld %3lld %10.1f %10.1f %10.1f %9.1f %6.1f %6.1f %10.2f %s\n",
                r.policy.c_str(), static_cast<long long>(r.n), static_cast<long long>(r.w),
                r.score_us, r.select_us, r.total_us, r.score_gbps,
                *copy > 0 ? 100.0 * r.score_gbps / *copy : 0.0,
                r.total_us > 0 ? 100.0 * r.select_us / r.total_us : 0.0, r.scratch_bytes / 1e6,
                note.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  bool any_model = false;
  for (const std::string& preset : presets) {
    bool needs_model = false;
    for (const auto& p : registry.presets()) {
      if (p.name != preset) continue;
      needs_model = ((registry.FindScorer(p.scorer)->required_inputs |
                      registry.FindAllocator(p.allocator)->required_inputs) &
                     kInputModel) != 0;
    }
    any_model = any_model || needs_model;
    const std::vector<int64_t>& ns = needs_model ? options.model_ns : options.ns;
    const std::vector<int64_t> windows =
        needs_model ? std::vector<int64_t>{options.model_w} : options.windows;
    for (int64_t n : ns) {
      for (int64_t w : windows) {
        print(RunConfig(registry, preset, n, w, options, stream,
                        static_cast<size_t>(prop.l2CacheSize), model));
      }
    }
  }
  if (any_model) {
    for (int64_t n : options.model_ns) {
      for (Row& r : RunHostRows(registry, model, n, options)) print(std::move(r));
    }
  }

  nlohmann::json doc;
  doc["device"] = device;
  doc["copy_gbps"] = *copy;
  doc["copy_mib"] = options.copy_mib;
  doc["reps"] = options.reps;
  doc["warmup"] = options.warmup;
  doc["keep_fraction"] = options.keep_fraction;
  doc["rows"] = nlohmann::json::array();
  for (const Row& r : rows) doc["rows"].push_back(RowJson(r, *copy));
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  const std::string json_path = options.out_dir + "/gpu_bench.json";
  const std::string csv_path = options.out_dir + "/gpu_bench.csv";
  std::ofstream(json_path) << doc.dump(2) << "\n";
  std::ofstream csv(csv_path);
  csv << "policy,scorer,n,w,bytes_read,score_us,select_us,total_us,score_gbps,total_gbps,"
         "copy_gbps,select_share,scratch_bytes,error,note\n";
  for (const Row& r : rows) {
    csv << r.policy << "," << r.scorer << "," << r.n << "," << r.w << "," << r.bytes << ","
        << r.score_us << "," << r.select_us << "," << r.total_us << "," << r.score_gbps << ","
        << r.total_gbps << "," << *copy << ","
        << (r.total_us > 0 ? r.select_us / r.total_us : 0) << "," << r.scratch_bytes << ",\""
        << r.error << "\",\"" << r.note << "\"\n";
  }
  std::printf("\nwrote %s and %s\n", json_path.c_str(), csv_path.c_str());
  cudaStreamDestroy(stream);
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace kvtrim::gpu::bench

int main(int argc, char** argv) { return kvtrim::gpu::bench::Main(argc, argv); }
