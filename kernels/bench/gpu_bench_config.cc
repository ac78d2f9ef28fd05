#include "kernels/bench/gpu_bench_config.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/bench/gpu_bench_fill.h"
#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/gpu/device_error.h"
#include "kernels/gpu/device_pipeline.h"

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

/// Detects a `numerics` member of type Numerics in LayerPlan (the mode the plan computes);
/// the bench reports it when the pipeline exposes it and null otherwise.
template <typename P, typename = void>
struct HasPlanNumerics : std::false_type {};
template <typename P>
struct HasPlanNumerics<P, std::void_t<decltype(std::declval<const P&>().numerics)>>
    : std::is_same<std::decay_t<decltype(std::declval<const P&>().numerics)>, Numerics> {};

/// The numerics `plan` says it computes, when LayerPlan carries that field.
template <typename P>
std::optional<Numerics> PlannedNumerics(const P& plan) {
  if constexpr (HasPlanNumerics<P>::value) {
    return plan.numerics;
  } else {
    return std::nullopt;
  }
}

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

/// Pinned host floats freed on destruction.
struct PinnedFloats {
  float* p = nullptr;
  ~PinnedFloats() {
    if (p != nullptr) cudaFreeHost(p);
  }
};

/// Times one plan on `sets` into `row` (score / select / total medians, scratch, the answer's
/// check, stages). Returns the first error (the caller stores it in row.error).
absl::Status MeasurePlan(const ResolvedPolicy& policy, const LayerPlan& plan,
                         const LayerBudget& budget, const InputPlan& in,
                         const std::vector<InputSet>& sets, const Options& options,
                         cudaStream_t stream, const BenchModel& model, LaunchRecorder* recorder,
                         Row* row) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  auto layer_of = [&](const InputSet& s) {
    return MakeDeviceLayer(plan, in.shape, in.dtype, scale, kLayerId, policy.settings.seed,
                           s.keys.get(), s.values.get(), s.queries.get());
  };

  // Working regions (one set; every repetition overwrites them).
  ArenaLayout layout;
  const PipelineRegions regions = AddPipelineRegions(plan, layer_of(sets[0]), &layout);
  row->scratch_bytes = static_cast<int64_t>(layout.total());
  DeviceBuffer work;
  KVTRIM_RETURN_IF_ERROR(work.Allocate(layout.total()));
  PipelineBuffers buffers = ResolveBuffers(plan, regions, work.get());
  buffers.model.w_o = static_cast<const float*>(model.w_o.get());
  buffers.model.head_gram = static_cast<const float*>(model.head_gram.get());
  buffers.model.group_gram = static_cast<const float*>(model.group_gram.get());
  buffers.model.hidden = static_cast<int32_t>(options.hidden);
  buffers.fast_model.w_o16 = model.w_o16.get();
  buffers.model.half_scale2 = 0.5f / static_cast<float>(kHeadDim);
  if (plan.needs_ea_stats) {  // random statistics in the arena regions
    const int64_t vf = LaneMajorFloats(kHeadDim);
    const int64_t hq = plan.model_query_heads;
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchFillPseudoNormal(const_cast<float*>(buffers.model.ea_mean), DType::kF32, hq * vf,
                               81, 1.0f, stream),
        "fill ea_mean");
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchFillPseudoNormal(const_cast<float*>(buffers.model.ea_cov), DType::kF32,
                               hq * kHeadDim * vf, 82, 0.05f, stream),
        "fill ea_cov");
  }
  const std::vector<int64_t> meta = MetaInit(plan);
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers.counts, meta.data(),
                                              meta.size() * sizeof(int64_t),
                                              cudaMemcpyHostToDevice, stream),
                              "upload meta");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "fill");

  PhaseTimer timer;
  KVTRIM_RETURN_IF_ERROR(timer.Init());
  // Host-decided presets: pinned buffers for the scores coming back.
  const bool host_decide = plan.host_decide;
  const bool score_only = plan.scorer == ScorerKind::kLaProx;  // decided model-wide (host row)
  const size_t score_count = static_cast<size_t>(kKvHeads * in.shape.num_tokens);
  PinnedFloats pinned;
  if (host_decide && !score_only) {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned.p, 2 * score_count * sizeof(float)),
                                "cudaMallocHost");
  }
  row->host_decided = host_decide && !score_only;
  if (host_decide) {
    row->note = score_only ? "score kernel only (selection: laprox_decide32)"
                           : "select = scores to host + DecideLayer (host clock)";
  }
  // The device part of one repetition (events: the phase boundaries, or null).
  auto enqueue = [&](const InputSet& set, const PipelineEvents* events) -> absl::Status {
    if (!host_decide) return EnqueueLayer(plan, layer_of(set), buffers, stream, events);
    KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(plan, layer_of(set), buffers, stream));
    if (events != nullptr) {
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events->after_score, stream), "cudaEventRecord");
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events->after_select, stream),
                                  "cudaEventRecord");
    }
    return absl::OkStatus();
  };
  LayerDecision host_decision;
  std::vector<double> score_ms, select_ms, total_ms;
  for (int rep = 0; rep < options.warmup + options.reps; ++rep) {
    const InputSet& set = sets[static_cast<size_t>(rep) % sets.size()];
    PhaseTimes times;
    KVTRIM_RETURN_IF_ERROR(timer.Time(stream, &times, [&](const PipelineEvents& events) {
      return enqueue(set, &events);
    }));
    if (host_decide && !score_only) {
      const auto t0 = std::chrono::steady_clock::now();
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned.p, buffers.scores,
                                                  score_count * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream),
                                  "download scores");
      if (plan.critical) {
        KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned.p + score_count, buffers.critical,
                                                    score_count * sizeof(float),
                                                    cudaMemcpyDeviceToHost, stream),
                                    "download critical");
      }
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "download");
      std::vector<float> scores(pinned.p, pinned.p + score_count);
      std::vector<float> critical;
      if (plan.critical) critical.assign(pinned.p + score_count, pinned.p + 2 * score_count);
      KVTRIM_RETURN_IF_ERROR(DecideOnHost(policy, plan, kLayerId, kNumLayers, budget,
                                          std::move(scores), std::move(critical),
                                          &host_decision));
      const double host_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      times.select_ms = host_ms;
      times.total_ms = times.score_ms + host_ms;
    }
    if (rep < options.warmup) continue;
    score_ms.push_back(times.score_ms);
    select_ms.push_back(times.select_ms);
    total_ms.push_back(times.total_ms);
  }
  row->score_us = 1e3 * Median(score_ms);
  row->select_us = 1e3 * Median(select_ms);
  row->total_us = 1e3 * Median(total_ms);
  row->score_gbps = row->bytes > 0 ? static_cast<double>(row->bytes) / (row->score_us * 1e3) : 0;
  row->total_gbps = row->bytes > 0 ? static_cast<double>(row->bytes) / (row->total_us * 1e3) : 0;

  // The answer must be well formed: offsets [H + 1] ending at the planned total, and every
  // list strictly ascending inside [0, n) (a cheap check that catches unwritten slots).
  const int64_t n = in.shape.num_tokens;
  if (host_decide) {
    if (!score_only) row->error = CheckAnswer(host_decision.offsets, host_decision.indices, n, -1);
  } else {
    std::vector<int64_t> offsets(static_cast<size_t>(plan.num_lists()) + 1);
    std::vector<int32_t> indices(static_cast<size_t>(plan.total_indices));
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpy(offsets.data(), buffers.offsets,
                                           offsets.size() * sizeof(int64_t),
                                           cudaMemcpyDeviceToHost),
                                "download offsets");
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpy(indices.data(), buffers.indices,
                                           indices.size() * sizeof(int32_t),
                                           cudaMemcpyDeviceToHost),
                                "download indices");
    row->error = CheckAnswer(offsets, indices, n, plan.total_indices);
  }

  // --stages: per-launch events in extra repetitions (the medians above stay free of them).
  if (recorder != nullptr) {
    for (int rep = 0; rep < options.stage_reps; ++rep) {
      KVTRIM_RETURN_IF_ERROR(recorder->Begin(stream));
      const absl::Status st = enqueue(sets[static_cast<size_t>(rep) % sets.size()], nullptr);
      const absl::Status ended = recorder->End();
      KVTRIM_RETURN_IF_ERROR(st);
      KVTRIM_RETURN_IF_ERROR(ended);
    }
    row->stages = recorder->TakeMedians();
  }
  return absl::OkStatus();
}

}  // namespace

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
                           int64_t w, DType dtype, const Options& options, cudaStream_t stream,
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
  const bool reads_keys = base.scorer != "streaming_llm" && base.scorer != "random";
  base.bytes = static_cast<int64_t>((reads_keys ? in.kv_bytes : 0) +
                                    (in.shape.has_values ? in.kv_bytes : 0) +
                                    (in.shape.has_queries ? in.q_bytes : 0));
  const size_t set_bytes = in.kv_bytes * (in.shape.has_values ? 2 : 1) + in.q_bytes;
  base.input_sets = static_cast<int>(
      std::clamp<size_t>((4 * l2_bytes + set_bytes - 1) / set_bytes, 2, 64));

  std::vector<InputSet> sets;
  if (absl::Status st = MakeInputs(in, base.input_sets, stream, &sets); !st.ok()) {
    return fail_all(st);
  }
  for (Numerics mode : options.numerics) {
    Row row = base;
    row.numerics = mode;
    ResolvedPolicy moded = *policy;
    moded.settings.numerics = mode;  // what PlanLayer reads
    auto plan = PlanLayer(moded, in.shape, dtype, kLayerId, kNumLayers, budget);
    if (!plan.ok()) {
      row.error = plan.status().ToString();
      rows.push_back(std::move(row));
      continue;
    }
    plan->perturbation = false;  // a statistic, not part of the policy's decision
    plan->reads_values = in.shape.has_values;
    plan->reads_queries = in.shape.has_queries;
    row.planned = PlannedNumerics(*plan);
    if (absl::Status st = MeasurePlan(moded, *plan, budget, in, sets, options, stream, model,
                                      recorder, &row);
        !st.ok()) {
      row.error = st.ToString();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kvtrim::gpu::bench
