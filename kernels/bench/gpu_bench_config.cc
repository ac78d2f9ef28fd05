#include "kernels/bench/gpu_bench_config.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <array>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/bench/gpu_bench_fill.h"
#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/device_pipeline.h"
#include "kernels/gpu/runtime/layer_run.h"

namespace kvtrim::gpu::bench {
namespace {

/// Device-resident K/V/Q of one input set.
struct InputSet {
  DeviceBuffer keys, values, queries;
};

/// The tensors a configuration reads and their sizes.
struct InputPlan {
  LayerShape shape;
  DType dtype = DType::kBF16;
  size_t kv_bytes = 0;  // K (and V) of one set
  size_t q_bytes = 0;   // Q of one set
};

/// Resolves `preset` with the bench's settings; window parameters above w are lowered to w
/// (SnapKV's 32 at w = 8). Attaches the bench model when the policy reads one.
absl::StatusOr<ResolvedPolicy> ResolvePreset(const PolicyRegistry& registry,
                                             const std::string& preset, int64_t w,
                                             const Options& options, const BenchModel& model) {
  CompressionSettings settings;
  settings.policy = preset;
  settings.budget.keep_fraction = options.keep_fraction;
  settings.num_layers = kNumLayers;
  settings.seed = 3;
  auto probe = registry.Resolve(settings, "settings");
  if (!probe.ok()) return probe.status();
  if (probe->params.Has("window") && probe->params.Int("window") > w) {
    settings.params["window"] = ParamValue::Number(static_cast<double>(w));
  }
  auto policy = registry.Resolve(settings, "settings");
  if (!policy.ok()) return policy.status();
  if ((policy->scorer->required_inputs | policy->allocator->required_inputs) & kInputModel) {
    policy->model = model.host;
  }
  return policy;
}

/// Allocates `bytes` of `dtype` in `buffer` and fills them with N(0, scale^2) values.
absl::Status AllocateFilled(DeviceBuffer* buffer, size_t bytes, DType dtype, uint64_t seed,
                            float scale, cudaStream_t stream, const char* what) {
  KVTRIM_RETURN_IF_ERROR(buffer->Allocate(bytes));
  KVTRIM_CUDA_RETURN_IF_ERROR(
      LaunchFillPseudoNormal(buffer->get(), dtype, static_cast<int64_t>(bytes / DTypeSize(dtype)),
                             seed, scale, stream),
      what);
  return absl::OkStatus();
}

/// Allocates and fills `count` input sets of `in` on the device (deterministic seeds).
absl::Status MakeInputs(const InputPlan& in, int count, cudaStream_t stream,
                        std::vector<InputSet>* sets) {
  sets->clear();
  sets->resize(static_cast<size_t>(count));
  for (size_t s = 0; s < sets->size(); ++s) {
    InputSet& set = (*sets)[s];
    const uint64_t seed = 1000 * (s + 1);
    KVTRIM_RETURN_IF_ERROR(
        AllocateFilled(&set.keys, in.kv_bytes, in.dtype, seed, 1.0f, stream, "fill keys"));
    if (in.shape.has_values) {
      KVTRIM_RETURN_IF_ERROR(AllocateFilled(&set.values, in.kv_bytes, in.dtype, seed + 1, 1.0f,
                                            stream, "fill values"));
    }
    if (in.shape.has_queries) {
      KVTRIM_RETURN_IF_ERROR(AllocateFilled(&set.queries, in.q_bytes, in.dtype, seed + 2, 1.5f,
                                            stream, "fill queries"));
    }
  }
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "fill inputs");
  return absl::OkStatus();
}

/// A validated layer over one input set's device tensors (read in place, as CUDA IPC
/// tensors are), with the bench's shape and scale.
ValidatedLayer DeviceLayerOf(const InputPlan& in, const InputSet& set) {
  ValidatedLayer layer;
  layer.layer_id = kLayerId;
  layer.num_layers = kNumLayers;
  layer.shape = in.shape;
  auto view = [&](const DeviceBuffer& buffer, std::array<int64_t, 3> shape) {
    TensorView t;
    t.data = buffer.get();
    t.dtype = in.dtype;
    t.shape = shape;
    t.space = MemorySpace::kDevice;
    return t;
  };
  const int64_t heads = in.shape.num_kv_heads;
  const int64_t n = in.shape.num_tokens;
  layer.keys = view(set.keys, {heads, n, kHeadDim});
  if (in.shape.has_values) layer.values = view(set.values, {heads, n, kHeadDim});
  if (in.shape.has_queries) {
    layer.queries = view(set.queries, {in.shape.num_query_heads, in.shape.window_rows, kHeadDim});
  }
  layer.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  return layer;
}

/// Median microseconds of the phases over timed repetitions.
struct PhaseMedians {
  double score_us = 0, select_us = 0, total_us = 0;
};

/// `warmup` + `reps` Enqueues (no copies back) rotating over `runs`, each between the
/// timer's CUDA events; the medians of the last `reps` go to `out`.
absl::Status TimeRepetitions(const std::vector<std::unique_ptr<LayerRun>>& runs, int warmup,
                             int reps, cudaStream_t stream, PhaseTimer& timer,
                             PhaseMedians* out) {
  std::vector<double> score_ms, select_ms, total_ms;
  for (int rep = 0; rep < warmup + reps; ++rep) {
    LayerRun& run = *runs[static_cast<size_t>(rep) % runs.size()];
    PhaseTimes times;
    KVTRIM_RETURN_IF_ERROR(timer.Time(stream, &times, [&](const PipelineEvents& events) {
      return run.Enqueue(&events, /*copy_back=*/false);
    }));
    if (rep < warmup) continue;
    score_ms.push_back(times.score_ms);
    select_ms.push_back(times.select_ms);
    total_ms.push_back(times.total_ms);
  }
  out->score_us = 1e3 * Median(score_ms);
  out->select_us = 1e3 * Median(select_ms);
  out->total_us = 1e3 * Median(total_ms);
  return absl::OkStatus();
}

/// Times `policy` on `sets` through the GPU runtime itself (layer_run.h): one LayerRun per set,
/// each planned and staged once (the inputs read in place, probed for NaN), then
/// options.warmup + options.reps Enqueues rotating over the sets between CUDA events (the
/// copies of the answer back to the host left out), a last Enqueue and Fetch whose answer is
/// checked, and with `recorder` options.stage_reps more Enqueues recorded launch by launch.
/// Fills `row` (score / select / total medians, scratch, planned numerics, stages).
absl::Status MeasureRuns(const ResolvedPolicy& policy, const LayerBudget& budget,
                         const InputPlan& in, const std::vector<InputSet>& sets,
                         const Options& options, BenchRuntime& runtime, LaunchRecorder* recorder,
                         Row* row) {
  std::vector<ValidatedLayer> layers;
  for (const InputSet& set : sets) layers.push_back(DeviceLayerOf(in, set));
  LayerDecision decision;
  RunOutputs outputs;
  outputs.decision = &decision;
  std::vector<std::unique_ptr<LayerRun>> runs;
  for (const ValidatedLayer& layer : layers) {
    runs.push_back(std::make_unique<LayerRun>(runtime.context(), runtime.cache(),
                                              runtime.store(), policy, layer, budget, outputs));
    KVTRIM_RETURN_IF_ERROR(runs.back()->Plan());
    KVTRIM_RETURN_IF_ERROR(runs.back()->Stage());
  }
  const LayerPlan& plan = runs.front()->plan();
  row->planned = plan.numerics;
  row->host_decided = plan.host_decide && plan.decision.kind == DecisionKind::kNone;
  row->scratch_bytes = static_cast<int64_t>(runs.front()->arena_bytes());
  cudaStream_t stream = runtime.context().stream();
  LaunchGraphCache& graphs = runtime.context().graphs();
  PhaseTimer timer;
  KVTRIM_RETURN_IF_ERROR(timer.Init());
  // As served: each set's launch sequence is issued directly on its first sight, captured
  // into a graph on its second and replayed after, so the warm-up covers two rounds of sets.
  const int warmup = options.warmup + (graphs.capacity() > 0 ? 2 * static_cast<int>(runs.size())
                                                              : 0);
  const LaunchGraphStats before = graphs.stats();
  PhaseMedians timed;
  KVTRIM_RETURN_IF_ERROR(TimeRepetitions(runs, warmup, options.reps, stream, timer, &timed));
  row->score_us = timed.score_us;
  row->select_us = timed.select_us;
  row->total_us = timed.total_us;
  row->graph_replays = graphs.stats().replayed - before.replayed;
  row->graph_direct = graphs.stats().direct - before.direct;

  // The same repetitions with every launch issued one by one (graphs off), for the ratio.
  const size_t capacity = graphs.capacity();
  if (capacity > 0 && options.compare_direct && !plan.host_decide &&
      plan.numerics == Numerics::kFast) {
    graphs.set_capacity(0);
    PhaseMedians direct;
    const absl::Status st =
        TimeRepetitions(runs, options.warmup, options.reps, stream, timer, &direct);
    graphs.set_capacity(capacity);
    KVTRIM_RETURN_IF_ERROR(st);
    row->direct_us = direct.total_us;
  }
  row->score_gbps = row->bytes > 0 ? static_cast<double>(row->bytes) / (row->score_us * 1e3) : 0;
  row->total_gbps = row->bytes > 0 ? static_cast<double>(row->bytes) / (row->total_us * 1e3) : 0;

  // The answer must be well formed: offsets ending at the planned total, and every list
  // strictly ascending inside [0, n) (a cheap check that catches unwritten slots).
  // Three times: issued directly, captured, replayed from the graph; all three must agree.
  LayerDecision first;
  for (int round = 0; round < 3 && row->error.empty(); ++round) {
    KVTRIM_RETURN_IF_ERROR(runs.front()->Enqueue());
    KVTRIM_RETURN_IF_ERROR(runs.front()->Fetch());
    row->error = CheckAnswer(decision.offsets, decision.indices, in.shape.num_tokens, -1);
    if (round == 0) {
      first = decision;
    } else if (row->error.empty() &&
               (decision.offsets != first.offsets || decision.indices != first.indices)) {
      row->error = absl::StrCat("answer ", round + 1, " differs from the first (launch graph)");
    }
  }

  // --stages: per-launch events in extra repetitions (the medians above stay free of them),
  // launched one by one (the hooks see launches, not graph replays).
  if (recorder != nullptr) {
    graphs.set_capacity(0);
    for (int rep = 0; rep < options.stage_reps; ++rep) {
      KVTRIM_RETURN_IF_ERROR(recorder->Begin(stream));
      const absl::Status st =
          runs[static_cast<size_t>(rep) % runs.size()]->Enqueue(nullptr, /*copy_back=*/false);
      const absl::Status ended = recorder->End();
      KVTRIM_RETURN_IF_ERROR(st);
      KVTRIM_RETURN_IF_ERROR(ended);
    }
    graphs.set_capacity(capacity);
    row->stages = recorder->TakeMedians();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BenchRuntime>> BenchRuntime::Create(int device) {
  std::unique_ptr<BenchRuntime> runtime(new BenchRuntime(device));
  auto context = WorkerContext::Create(device, WorkerOptions());
  if (!context.ok()) return context.status();
  runtime->context_ = *std::move(context);
  return runtime;
}

bool PresetNeedsModel(const PolicyRegistry& registry, const std::string& preset) {
  for (const auto& p : registry.presets()) {
    if (p.name != preset) continue;
    return ((registry.FindScorer(p.scorer)->required_inputs |
             registry.FindAllocator(p.allocator)->required_inputs) &
            kInputModel) != 0;
  }
  return false;
}

std::vector<Row> RunConfig(const PolicyRegistry& registry, const std::string& preset, int64_t n,
                           int64_t w, DType dtype, const Options& options, BenchRuntime& runtime,
                           size_t l2_bytes, const BenchModel& model, LaunchRecorder* recorder) {
  Row base;
  base.policy = preset;
  base.n = n;
  base.w = w;
  base.dtype = dtype;
  std::vector<Row> rows;
  auto fail_all = [&](const absl::Status& status) {
    for (Numerics mode : options.numerics) {
      Row r = base;
      r.numerics = mode;
      r.error = status.ToString();
      rows.push_back(std::move(r));
    }
    return rows;
  };
  absl::StatusOr<ResolvedPolicy> policy = ResolvePreset(registry, preset, w, options, model);
  if (!policy.ok()) return fail_all(policy.status());
  base.scorer = policy->scorer->name;
  const uint32_t needs = policy->scorer->required_inputs;

  InputPlan in;
  in.dtype = dtype;
  in.shape.num_kv_heads = kKvHeads;
  in.shape.num_tokens = n;
  in.shape.head_dim = kHeadDim;
  in.shape.has_values = (needs & kInputValues) != 0;
  in.shape.has_queries = (needs & kInputQueries) != 0;
  in.shape.num_query_heads = in.shape.has_queries ? kKvHeads * kGroup : 0;
  in.shape.window_rows = in.shape.has_queries ? w : 0;
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy->settings.budget, n);
  budget.requested = policy->scorer->default_protection(policy->params, budget.kept_per_head);
  budget.protection = ClampProtection(budget.requested, budget.kept_per_head, n);

  const size_t elem = DTypeSize(dtype);
  in.kv_bytes = static_cast<size_t>(kKvHeads * n * kHeadDim) * elem;
  in.q_bytes = static_cast<size_t>(kKvHeads * kGroup * w * kHeadDim) * elem;
  const bool reads_keys = policy->scorer->reads_key_values;
  base.bytes = static_cast<int64_t>((reads_keys ? in.kv_bytes : 0) +
                                    (in.shape.has_values ? in.kv_bytes : 0) +
                                    (in.shape.has_queries ? in.q_bytes : 0));
  const size_t set_bytes = in.kv_bytes * (in.shape.has_values ? 2 : 1) + in.q_bytes;
  base.input_sets = static_cast<int>(
      std::clamp<size_t>((4 * l2_bytes + set_bytes - 1) / set_bytes, 2, 64));

  std::vector<InputSet> sets;
  if (absl::Status st = MakeInputs(in, base.input_sets, runtime.context().stream(), &sets);
      !st.ok()) {
    return fail_all(st);
  }
  for (Numerics mode : options.numerics) {
    Row row = base;
    row.numerics = mode;
    ResolvedPolicy moded = *policy;
    moded.settings.numerics = mode;        // what PlanLayer reads
    moded.settings.perturbation = false;   // a statistic, not part of the policy's decision
    if (absl::Status st = MeasureRuns(moded, budget, in, sets, options, runtime, recorder, &row);
        !st.ok()) {
      row.error = st.ToString();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kvtrim::gpu::bench
