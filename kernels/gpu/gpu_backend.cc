#include "kernels/gpu/gpu_backend.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/device_decision.h"
#include "kernels/gpu/device_error.h"
#include "kernels/gpu/device_input_stage.h"
#include "kernels/gpu/device_nan_probe.h"
#include "kernels/gpu/device_pipeline.h"
#include "kernels/gpu/device_probe.h"
#include "kernels/expected_attention_stats.h"

namespace kvtrim::gpu {

absl::StatusOr<std::unique_ptr<GpuBackend>> GpuBackend::Create(const GpuBackendOptions& options) {
  const DeviceCensus census = CountCudaDevices();
  if (census.count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device is visible (", census.reason, ")"));
  }
  if (options.device < 0 || options.device >= census.count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", options.device, " does not exist; ", census.count, " visible"));
  }
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the GPU backend needs at least one worker, got ", options.workers));
  }
  std::unique_ptr<GpuBackend> backend(new GpuBackend(options));
  backend->cpu_fallback_ = std::make_unique<CpuBackend>(std::max(
      1, std::min(options.workers, static_cast<int>(std::thread::hardware_concurrency()))));
  backend->description_ = DescribeCudaDevice(options.device);
  WorkerOptions worker;
  worker.arena_limit_bytes = options.arena_limit_bytes;
  worker.staging_chunk_bytes = options.staging_chunk_bytes;
  auto pool = DevicePool::Create(options.device, options.workers, worker);
  if (!pool.ok()) return pool.status();
  backend->pool_ = *std::move(pool);
  const size_t cache_bytes =
      options.model_cache_bytes != 0 ? options.model_cache_bytes : options.arena_limit_bytes;
  backend->model_cache_ = std::make_unique<DeviceModelCache>(options.device, cache_bytes);
  const size_t score_bytes = options.score_buffer_bytes != 0
                                 ? options.score_buffer_bytes
                                 : options.arena_limit_bytes * static_cast<size_t>(options.workers);
  auto store = DeviceScoreStore::Create(options.device, score_bytes);
  if (!store.ok()) return store.status();
  backend->score_store_ = *std::move(store);
  return backend;
}

std::vector<Numerics> GpuBackend::NumericsModes(const ScorerSpec& scorer,
                                                const AllocatorSpec& allocator) const {
  (void)allocator;
  if (HasFastPath(scorer.kind, DType::kBF16, 128)) return {Numerics::kFast, Numerics::kExact};
  return {Numerics::kExact};
}

std::string GpuBackend::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

namespace {

/// Layers with d > kMaxGpuHeadDim run on the CPU fallback, which cannot read device tensors.
absl::Status CheckHostOnly(const ValidatedLayer& layer) {
  if (!layer.has_device_tensors()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "keys.shape[2]: d=", layer.shape.head_dim, " is above the GPU kernels' limit of ",
      GpuBackend::kMaxGpuHeadDim, "; such layers run on the CPU, which cannot read cuda_ipc "
      "tensors (send host_shm or inline_data)"));
}

}  // namespace

absl::Status GpuBackend::CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                       const LayerBudget& budget, LayerDecision* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim) {
    KVTRIM_RETURN_IF_ERROR(CheckHostOnly(layer));
    return cpu_fallback_->CompressLayer(policy, layer, budget, out);
  }
  Outputs outputs;
  outputs.decision = out;
  return Run(policy, layer, budget, outputs);
}

absl::Status GpuBackend::ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                    const LayerBudget& budget, LayerScores* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim) {
    KVTRIM_RETURN_IF_ERROR(CheckHostOnly(layer));
    return cpu_fallback_->ScoreLayer(policy, layer, budget, out);
  }
  Outputs outputs;
  outputs.raw = out;
  return Run(policy, layer, budget, outputs);
}

absl::Status GpuBackend::ScoreLayerForModelWide(const ResolvedPolicy& policy,
                                                const ValidatedLayer& layer,
                                                const LayerBudget& budget, LayerScores* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim || policy.scorer->kind != ScorerKind::kLaProx) {
    return ScoreLayer(policy, layer, budget, out);
  }
  absl::StatusOr<LaProxPlan> laprox = PlanLaProx(policy);
  if (!laprox.ok()) return ScoreLayer(policy, layer, budget, out);  // the decision reports it
  Outputs outputs;
  outputs.resident = out;
  outputs.normalize = laprox->normalize;
  return Run(policy, layer, budget, outputs);
}

absl::StatusOr<std::vector<LayerDecision>> GpuBackend::DecideModelWide(
    const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) {
  if (layers.empty()) return std::vector<LayerDecision>();
  std::vector<LayerDecision> decisions;
  KVTRIM_RETURN_IF_ERROR(OnWorker([&](WorkerContext& context) {
    return DecideModelWideOnDevice(context, *score_store_, policy, layers, &decisions);
  }));
  return decisions;
}

absl::Status GpuBackend::KeepScoresOnDevice(const ResolvedPolicy& policy, LayerScores* layer) {
  absl::StatusOr<LaProxPlan> laprox = PlanLaProx(policy);
  if (!laprox.ok()) return laprox.status();
  const Protection& p = layer->budget.protection;
  const int64_t heads = layer->num_heads;
  const int64_t n = layer->num_tokens;
  const int64_t width = n - p.sink - p.recent;
  if (heads < 0 || heads > 65535 || width < 0 ||
      layer->scores.size() != static_cast<size_t>(heads * n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scores: ", layer->scores.size(), " values do not make a layer of H_kv=", heads,
        ", n=", n, " with sink=", p.sink, ", recent=", p.recent));
  }
  std::vector<float> candidates(static_cast<size_t>(heads * width));
  for (int64_t h = 0; h < heads; ++h) {
    std::copy_n(layer->scores.begin() + h * n + p.sink, width, candidates.begin() + h * width);
  }
  absl::StatusOr<std::shared_ptr<DeviceScoreBuffer>> buffer;
  KVTRIM_RETURN_IF_ERROR(OnWorker([&](WorkerContext& context) -> absl::Status {
    buffer = score_store_->Allocate(candidates.size(), context.stream());
    if (!buffer.ok()) return buffer.status();
    if (candidates.empty()) return absl::OkStatus();
    KVTRIM_RETURN_IF_ERROR(
        context.Upload((*buffer)->data(), candidates.data(), candidates.size() * sizeof(float)));
    if (laprox->normalize) {
      const size_t scratch = NormalizeCandidatesScratchBytes(heads * width);
      KVTRIM_RETURN_IF_ERROR(context.arena().Reserve(scratch));
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchNormalizeCandidates((*buffer)->data(), static_cast<int32_t>(heads), width, width,
                                    context.arena().data(), scratch, context.stream()),
          "LaunchNormalizeCandidates");
    }
    return context.Synchronize();
  }));
  (*buffer)->set_layout(ScoreBufferLayout{heads, n, p.sink, p.recent, laprox->normalize});
  layer->resident = *std::move(buffer);
  layer->scores.clear();
  layer->critical.clear();
  return absl::OkStatus();
}

absl::Status GpuBackend::ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                    const LayerBudget& budget, std::vector<float>* scores) {
  Outputs outputs;
  outputs.protected_scores = scores;
  return Run(policy, layer, budget, outputs);
}

absl::Status GpuBackend::CheckHealthy() const {
  if (healthy()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "the GPU backend is out of service after a sticky CUDA error (", failure(),
      "); kvtrimd must be restarted"));
}

absl::Status GpuBackend::Run(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, const Outputs& outputs) {
  return OnWorker([&](WorkerContext& context) {
    return RunLayer(context, policy, layer, budget, outputs);
  });
}

absl::Status GpuBackend::OnWorker(const std::function<absl::Status(WorkerContext&)>& work) {
  KVTRIM_RETURN_IF_ERROR(CheckHealthy());
  DevicePool::Lease lease = pool_->Acquire();
  absl::Status status = [&]() -> absl::Status {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
    cudaGetLastError();  // a stale non-sticky error of this thread is not ours
    return work(*lease);
  }();
  if (!status.ok()) HandleFailure(*lease, status);
  return status;
}

namespace {

/// Copies `count` values of T from pinned `src` into a vector.
template <typename T>
std::vector<T> FromPinned(const char* src, size_t count) {
  const auto* p = reinterpret_cast<const T*>(src);
  return std::vector<T>(p, p + count);
}

}  // namespace

absl::Status GpuBackend::RunLayer(WorkerContext& context, const ResolvedPolicy& policy,
                                  const ValidatedLayer& layer, const LayerBudget& budget,
                                  const Outputs& outputs) {
  const LayerShape& shape = layer.shape;
  const DType dtype = layer.keys.dtype;
  absl::StatusOr<LayerPlan> plan =
      PlanLayer(policy, shape, dtype, layer.layer_id, layer.num_layers, budget);
  if (!plan.ok()) return plan.status();
  const bool decide = outputs.decision != nullptr;
  if (!decide) PlanScoresOnly(policy, shape, &*plan);
  // host_decide layers with a device decision: EnqueueDecision (nothing but the lists back).
  const bool device_decision = decide && plan->decision.kind != DecisionKind::kNone;
  const bool resident = outputs.resident != nullptr;
  cudaStream_t stream = context.stream();

  // Model inputs: cached per (model, layer, tensor); Expected Attention's statistics per call.
  DeviceModelInputs model_inputs;
  FastModelInputs fast_inputs;
  std::vector<std::shared_ptr<const DeviceModelTensor>> held;  // alive until the stream syncs
  std::vector<float> ea_mean, ea_cov;                          // lane-major host images
  if (plan->model_scorer) {
    if (policy.model == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "settings.model_digest: scorer '", plan->scorer_name, "' needs a registered model"));
    }
    const RegisteredModel& model = *policy.model;
    if (model.layout.head_dim != shape.head_dim || model.layout.num_kv_heads != shape.num_kv_heads ||
        (shape.has_queries && model.layout.num_query_heads != shape.num_query_heads)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keys.shape: the layer's heads (H_kv=", shape.num_kv_heads, ", H_q=",
          shape.num_query_heads, ", d=", shape.head_dim, ") do not match the registered model's"));
    }
    auto upload = [&context](void* dst, const void* src, size_t bytes) -> absl::Status {
      KVTRIM_RETURN_IF_ERROR(context.Upload(dst, src, bytes));
      return context.Synchronize();
    };
    auto fetch = [&](ModelTensor which, const float** into) -> absl::Status {
      auto tensor = model_cache_->Get(policy.model, layer.layer_id, which, upload);
      if (!tensor.ok()) return tensor.status();
      *into = (*tensor)->data();
      held.push_back(*std::move(tensor));
      return absl::OkStatus();
    };
    if (plan->needs_w_o) KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kWo, &model_inputs.w_o));
    const float* w_o16 = nullptr;  // fast numerics: the f16 image (not fp32: read as bytes)
    if (plan->needs_w_o16) KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kWoF16, &w_o16));
    fast_inputs.w_o16 = w_o16;
    if (plan->needs_head_gram) {
      KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kHeadGram, &model_inputs.head_gram));
    }
    if (plan->needs_group_gram) {
      KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kGroupGram, &model_inputs.group_gram));
    }
    model_inputs.hidden = model.layout.hidden_size;
    if (plan->needs_ea_stats) {
      // The CPU scorer's own host preparation (double, rounded once): identical inputs.
      // Device queries come back to the host first (w rows: small).
      TensorView host_queries = layer.queries;
      std::vector<uint32_t> downloaded;
      if (host_queries.present() && host_queries.on_device()) {
        KVTRIM_RETURN_IF_ERROR(
            DownloadDense(context, layer.queries, layer.ready_event, &downloaded));
        host_queries.data = downloaded.data();
        host_queries.space = MemorySpace::kHost;
        host_queries.layout = nullptr;
      }
      auto stats = ComputeExpectedQueryStats(model, policy.params, layer.layer_id,
                                             shape.num_tokens, host_queries, layer.softmax_scale);
      if (!stats.ok()) return stats.status();
      const int64_t d = shape.head_dim;
      const int64_t hq = model.layout.num_query_heads;
      ea_mean.assign(static_cast<size_t>(hq * LaneMajorFloats(d)), 0.0f);
      ea_cov.assign(static_cast<size_t>(hq * d * LaneMajorFloats(d)), 0.0f);
      ToLaneMajor(stats->mean.data(), hq, d, d, ea_mean.data());
      ToLaneMajor(stats->cov.data(), hq * d, d, d, ea_cov.data());
      model_inputs.half_scale2 = stats->half_scale2;
    }
  }

  // Device working set: inputs first, then the pipeline's regions.
  // Host inputs get arena slots; dense device inputs (CUDA IPC) are read in place.
  ArenaLayout layout;
  DeviceInputStage inputs;
  inputs.AddSlots(layer, plan->reads_keys, plan->reads_values, plan->reads_queries, &layout);
  // The scratch queries read shapes only, but reject null tensors: size the regions on a
  // placeholder address (never dereferenced) before the arena's base is known.
  const DeviceLayer sizing = MakeDeviceLayer(
      *plan, shape, dtype, layer.softmax_scale, layer.layer_id, layer.seed,
      inputs.DevicePointer(0, nullptr), inputs.DevicePointer(1, nullptr),
      inputs.DevicePointer(2, nullptr));
  const PipelineRegions regions = AddPipelineRegions(*plan, sizing, &layout);
  const DecisionRegions decision_regions =
      device_decision ? AddDecisionRegions(*plan, &layout) : DecisionRegions{};
  // Resident LaProx candidates [H_kv, width]: the normalisation's scratch.
  const int64_t width =
      shape.num_tokens - plan->protection.sink - plan->protection.recent;
  const size_t normalize_bytes =
      resident && outputs.normalize ? NormalizeCandidatesScratchBytes(shape.num_kv_heads * width)
                                    : 0;
  const size_t normalize_at = layout.Add(normalize_bytes);
  KVTRIM_RETURN_IF_ERROR(context.arena().Reserve(layout.total()));
  char* base = static_cast<char*>(context.arena().data());
  const DeviceLayer device_layer = MakeDeviceLayer(
      *plan, shape, dtype, layer.softmax_scale, layer.layer_id, layer.seed,
      inputs.DevicePointer(0, base), inputs.DevicePointer(1, base), inputs.DevicePointer(2, base));
  PipelineBuffers buffers = ResolveBuffers(*plan, regions, base);
  buffers.model.w_o = model_inputs.w_o;
  buffers.model.head_gram = model_inputs.head_gram;
  buffers.model.group_gram = model_inputs.group_gram;
  buffers.model.hidden = model_inputs.hidden;
  buffers.model.half_scale2 = model_inputs.half_scale2;
  const DecisionBuffers decision_buffers =
      device_decision ? ResolveDecisionBuffers(*plan, decision_regions, base) : DecisionBuffers{};
  buffers.fast_model = fast_inputs;

  // Pinned transfer buffer: [meta upload | offsets | indices | perturbation | first NaN |
  // scores | critical | EA statistics | decision upload | critical first NaN].
  const std::vector<int64_t> meta = MetaInit(*plan);
  const size_t lists = static_cast<size_t>(plan->num_lists());
  const size_t heads = static_cast<size_t>(shape.num_kv_heads);
  const size_t n = static_cast<size_t>(shape.num_tokens);
  const size_t total = static_cast<size_t>(plan->total_indices);
  const bool download_scores =
      (!decide && !resident) || (decide && plan->host_decide && !device_decision);
  ArenaLayout host;
  const size_t meta_at = host.Add(meta.size() * sizeof(int64_t));
  const size_t offsets_at = host.Add((std::max(lists, heads) + 1) * sizeof(int64_t));
  const size_t indices_at = host.Add(total * sizeof(int32_t));
  const size_t perturbation_at = host.Add(heads * sizeof(double));
  const size_t nan_at = host.Add(sizeof(unsigned long long));
  const size_t scores_at = host.Add(download_scores ? heads * n * sizeof(float) : 0);
  const size_t critical_at =
      host.Add(download_scores && plan->critical ? heads * n * sizeof(float) : 0);
  const size_t ea_mean_at = host.Add(ea_mean.size() * sizeof(float));
  const size_t ea_cov_at = host.Add(ea_cov.size() * sizeof(float));
  const size_t decision_at = host.Add(decision_regions.upload_bytes);
  const size_t critical_nan_at = host.Add(sizeof(unsigned long long));
  KVTRIM_RETURN_IF_ERROR(context.transfer().Reserve(host.total()));
  char* pinned = context.transfer().data();
  // Queues the copy of the first-NaN slot into pinned + nan_at (read after a Synchronize).
  auto fetch_first_nan = [&]() {
    return CudaStatus(cudaMemcpyAsync(pinned + nan_at, buffers.first_nan,
                                      sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync(first_nan)");
  };

  // Inputs: host K/V/Q through the staging chunks, device ones in place or gathered (and
  // probed for NaN / Inf); the meta region and the EA statistics from the transfer buffer.
  KVTRIM_RETURN_IF_ERROR(inputs.Stage(context, base));
  std::memcpy(pinned + meta_at, meta.data(), meta.size() * sizeof(int64_t));
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers.counts, pinned + meta_at,
                                              meta.size() * sizeof(int64_t),
                                              cudaMemcpyHostToDevice, stream),
                              "cudaMemcpyAsync(meta)");
  if (plan->needs_ea_stats) {
    std::memcpy(pinned + ea_mean_at, ea_mean.data(), ea_mean.size() * sizeof(float));
    std::memcpy(pinned + ea_cov_at, ea_cov.data(), ea_cov.size() * sizeof(float));
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(const_cast<float*>(buffers.model.ea_mean), pinned + ea_mean_at,
                        ea_mean.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync(ea_mean)");
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(const_cast<float*>(buffers.model.ea_cov), pinned + ea_cov_at,
                        ea_cov.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync(ea_cov)");
  }

  if (resident) {
    // ScoreLayerForModelWide: the candidates move into a buffer of their own and stay there.
    const int64_t heads_kv = shape.num_kv_heads;
    auto buffer = score_store_->Allocate(static_cast<size_t>(heads_kv * width), stream);
    if (!buffer.ok()) return buffer.status();
    KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(*plan, device_layer, buffers, stream));
    if (width > 0) {
      const size_t row = static_cast<size_t>(width) * sizeof(float);
      KVTRIM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy2DAsync((*buffer)->data(), row, buffers.scores + plan->protection.sink,
                            n * sizeof(float), row, heads, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync(candidates)");
      if (outputs.normalize) {
        KVTRIM_CUDA_RETURN_IF_ERROR(
            LaunchNormalizeCandidates((*buffer)->data(), static_cast<int32_t>(heads_kv), width,
                                      width, base + normalize_at, normalize_bytes, stream),
            "LaunchNormalizeCandidates");
      }
    }
    KVTRIM_RETURN_IF_ERROR(fetch_first_nan());
    KVTRIM_RETURN_IF_ERROR(context.Synchronize());
    unsigned long long first_nan = 0;
    std::memcpy(&first_nan, pinned + nan_at, sizeof first_nan);
    KVTRIM_RETURN_IF_ERROR(NaNStatus(*plan, first_nan));
    (*buffer)->set_layout(ScoreBufferLayout{heads_kv, shape.num_tokens, plan->protection.sink,
                                            plan->protection.recent, outputs.normalize});
    outputs.resident->resident = *std::move(buffer);
    outputs.resident->scores.clear();
    outputs.resident->critical.clear();
    outputs.resident->numerics = plan->numerics;
    last_request_bytes_.store(layout.total());
    return absl::OkStatus();
  }

  if (download_scores) {
    // Scores come back: ScoreLayer, or a host-decided layer without a device decision.
    const size_t score_bytes = heads * n * sizeof(float);
    if (outputs.protected_scores != nullptr) {
      KVTRIM_RETURN_IF_ERROR(EnqueueScores(*plan, device_layer, buffers, stream));
    } else {
      KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(*plan, device_layer, buffers, stream));
    }
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + scores_at, buffers.scores, score_bytes,
                                                cudaMemcpyDeviceToHost, stream),
                                "cudaMemcpyAsync(scores)");
    if (plan->critical) {
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + critical_at, buffers.critical,
                                                  score_bytes, cudaMemcpyDeviceToHost, stream),
                                  "cudaMemcpyAsync(critical)");
    }
    KVTRIM_RETURN_IF_ERROR(fetch_first_nan());
    KVTRIM_RETURN_IF_ERROR(context.Synchronize());
    std::vector<float> scores = FromPinned<float>(pinned + scores_at, heads * n);
    std::vector<float> critical;
    if (plan->critical) critical = FromPinned<float>(pinned + critical_at, heads * n);
    if (outputs.protected_scores != nullptr) {
      // Protection overwrote protected tokens; the probe saw the raw scores (as the CPU
      // checks them), then critical.
      unsigned long long first_nan = 0;
      std::memcpy(&first_nan, pinned + nan_at, sizeof first_nan);
      KVTRIM_RETURN_IF_ERROR(NaNStatus(*plan, first_nan));
      KVTRIM_RETURN_IF_ERROR(HostNaNStatus(*plan, {}, critical));
      *outputs.protected_scores = std::move(scores);
      last_request_bytes_.store(layout.total());
      return absl::OkStatus();
    }
    if (outputs.raw != nullptr) {
      KVTRIM_RETURN_IF_ERROR(HostNaNStatus(*plan, scores, critical));
      outputs.raw->scores = std::move(scores);
      outputs.raw->numerics = plan->numerics;
      outputs.raw->critical = std::move(critical);
      last_request_bytes_.store(layout.total());
      return absl::OkStatus();
    }
    LayerDecision* out = outputs.decision;
    KVTRIM_RETURN_IF_ERROR(DecideOnHost(policy, *plan, layer.layer_id, layer.num_layers, budget,
                                        std::move(scores), std::move(critical), out));
    if (plan->perturbation) {
      // The host's lists go back to the device for the perturbation statistic.
      const size_t host_lists = out->offsets.size() - 1;
      if (host_lists != 1 && host_lists != heads) {
        return absl::InternalError(absl::StrCat("host decision has ", host_lists,
                                                " lists for ", heads, " heads"));
      }
      if (out->indices.size() > total) {
        return absl::InternalError("host decision holds more indices than the layer has tokens");
      }
      std::memcpy(pinned + offsets_at, out->offsets.data(), out->offsets.size() * sizeof(int64_t));
      std::memcpy(pinned + indices_at, out->indices.data(), out->indices.size() * sizeof(int32_t));
      KVTRIM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(buffers.offsets, pinned + offsets_at,
                          out->offsets.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(offsets)");
      if (!out->indices.empty()) {
        KVTRIM_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(buffers.indices, pinned + indices_at,
                            out->indices.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync(indices)");
      }
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchPerturbation(device_layer, buffers.offsets, static_cast<int32_t>(host_lists),
                             buffers.indices, buffers.perturbation, buffers.scratch,
                             buffers.scratch_bytes, stream),
          "LaunchPerturbation");
      KVTRIM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(pinned + perturbation_at, buffers.perturbation, heads * sizeof(double),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(perturbation)");
      KVTRIM_RETURN_IF_ERROR(context.Synchronize());
      out->perturbation = FromPinned<double>(pinned + perturbation_at, heads);
    } else {
      out->perturbation.clear();
    }
    last_request_bytes_.store(layout.total());
    return absl::OkStatus();
  }

  // The whole layer on the device.
  if (device_decision) {
    const std::vector<char> upload = DecisionUpload(*plan, buffers, decision_buffers);
    std::memcpy(pinned + decision_at, upload.data(), upload.size());
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(decision_buffers.upload, pinned + decision_at,
                                                upload.size(), cudaMemcpyHostToDevice, stream),
                                "cudaMemcpyAsync(decision upload)");
    KVTRIM_RETURN_IF_ERROR(
        EnqueueDecision(*plan, device_layer, buffers, decision_buffers, stream));
  } else {
    KVTRIM_RETURN_IF_ERROR(EnqueueLayer(*plan, device_layer, buffers, stream));
  }
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(pinned + offsets_at, buffers.offsets, (lists + 1) * sizeof(int64_t),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(offsets)");
  if (total > 0) {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + indices_at, buffers.indices,
                                                total * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                                stream),
                                "cudaMemcpyAsync(indices)");
  }
  if (plan->perturbation) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(pinned + perturbation_at, buffers.perturbation, heads * sizeof(double),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(perturbation)");
  }
  KVTRIM_RETURN_IF_ERROR(fetch_first_nan());
  if (device_decision && plan->critical) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(pinned + critical_nan_at, decision_buffers.critical_nan,
                        sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(critical first_nan)");
  }
  KVTRIM_RETURN_IF_ERROR(context.Synchronize());
  if (device_decision) {
    // The CPU backend's order: NaN in the scores, then in CriticalKV's stage-2 scores.
    unsigned long long first_nan = 0, critical_nan = kNoNaN;
    std::memcpy(&first_nan, pinned + nan_at, sizeof first_nan);
    if (plan->critical) std::memcpy(&critical_nan, pinned + critical_nan_at, sizeof critical_nan);
    KVTRIM_RETURN_IF_ERROR(DecisionNaNStatus(*plan, first_nan, critical_nan));
  }

  HostResults results;
  results.offsets = FromPinned<int64_t>(pinned + offsets_at, lists + 1);
  results.indices = FromPinned<int32_t>(pinned + indices_at, total);
  if (plan->perturbation) {
    results.perturbation = FromPinned<double>(pinned + perturbation_at, heads);
  }
  std::memcpy(&results.first_nan, pinned + nan_at, sizeof(unsigned long long));
  KVTRIM_RETURN_IF_ERROR(FinishDecision(*plan, layer.layer_id, std::move(results),
                                        outputs.decision));
  last_request_bytes_.store(layout.total());
  return absl::OkStatus();
}

void GpuBackend::HandleFailure(WorkerContext& context, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInternal) return;
  const std::optional<cudaError_t> code = CudaErrorOf(status);
  if (!code.has_value()) return;  // a consistency check, not a device fault
  bool sticky = IsStickyCudaError(*code);
  if (!sticky) {
    // Not known to be sticky: it is if the stream stays broken once the error is cleared.
    cudaGetLastError();
    const cudaError_t probe = cudaStreamSynchronize(context.stream());
    sticky = probe != cudaSuccess && probe != cudaErrorNotReady;
  }
  if (!sticky) return;
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.empty()) failure_ = std::string(status.message());
  }
  healthy_.store(false);
}

}  // namespace kvtrim::gpu
