#include "kernels/gpu/runtime/gpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/finite_scan.h"
#include "kernels/gpu/runtime/device_decision.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/device_probe.h"
#include "kernels/gpu/runtime/layer_run.h"
#include "kernels/layer_error.h"

namespace kvtrim::gpu {

int GpuBackend::HostFallbackThreads(const GpuBackendOptions& options) {
  return std::max(1, std::min(options.workers,
                              static_cast<int>(std::thread::hardware_concurrency())));
}

absl::StatusOr<std::unique_ptr<GpuBackend>> GpuBackend::Create(
    const GpuBackendOptions& options, std::unique_ptr<HostFallback> host_fallback) {
  if (host_fallback == nullptr) {
    return absl::InvalidArgumentError("the GPU backend needs a host fallback backend");
  }
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
  backend->host_fallback_ = std::move(host_fallback);
  backend->description_ = DescribeCudaDevice(options.device);
  WorkerOptions worker;
  worker.arena_limit_bytes = options.arena_limit_bytes;
  worker.staging_chunk_bytes = options.staging_chunk_bytes;
  worker.launch_graphs = options.launch_graphs;
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
  if (HasFastPath(scorer, DType::kBF16, 128)) return {Numerics::kFast, Numerics::kExact};
  return {Numerics::kExact};
}

std::string GpuBackend::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

namespace {

/// A layer decided on the host whose lists go to a device output target: uploaded there
/// (offsets, then indices), the worker's done event recorded, the stream synchronised.
absl::Status WriteHostDecision(WorkerContext& context, const OutputTarget& target,
                               LayerDecision* decision) {
  cudaStream_t stream = context.stream();
  char* base = static_cast<char*>(target.device);
  const size_t offset_bytes = decision->offsets.size() * sizeof(int64_t);
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base, decision->offsets.data(), offset_bytes,
                                              cudaMemcpyHostToDevice, stream),
                              "cudaMemcpyAsync(output offsets)");
  if (!decision->indices.empty()) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(base + offset_bytes, decision->indices.data(),
                        decision->indices.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                        stream),
        "cudaMemcpyAsync(output indices)");
  }
  if (target.done_event != nullptr) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(static_cast<cudaEvent_t>(target.done_event), stream),
        "cudaEventRecord(output done_event)");
  }
  KVTRIM_RETURN_IF_ERROR(context.Synchronize());
  decision->indices.clear();
  decision->output_written = true;
  return absl::OkStatus();
}


/// Layers with d > kMaxGpuHeadDim run on the CPU fallback, which cannot read device tensors
/// (refused) nor page-locked host shm mappings (copied into `storage` by DMA, so a segment
/// the worker shrank cannot fault, then scanned for NaN / Inf as the engine scans host
/// tensors). Returns the layer the fallback reads.
absl::StatusOr<ValidatedLayer> HostOnlyLayer(const ValidatedLayer& layer, int device,
                                             std::vector<std::vector<char>>* storage) {
  if (!layer.has_device_tensors()) {
    ValidatedLayer host = layer;
    std::pair<TensorView*, const char*> views[] = {
        {&host.keys, "keys"}, {&host.values, "values"}, {&host.queries, "queries"}};
    for (auto& [view, name] : views) {
      if (!view->present() || view->host_readable()) continue;
      std::vector<char>& bytes = storage->emplace_back(static_cast<size_t>(view->nbytes()));
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
      // Through device memory: a host-to-host cudaMemcpy would be a CPU copy, reading the
      // mapping on the host (SIGBUS once the worker shrank its segment).
      void* bounce = nullptr;
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaMalloc(&bounce, bytes.size()), "cudaMalloc(pinned bounce)");
      cudaError_t err = cudaMemcpy(bounce, view->data, bytes.size(), cudaMemcpyHostToDevice);
      if (err == cudaSuccess) {
        err = cudaMemcpy(bytes.data(), bounce, bytes.size(), cudaMemcpyDeviceToHost);
      }
      cudaFree(bounce);
      KVTRIM_CUDA_RETURN_IF_ERROR(err, "cudaMemcpy(pinned host input)");
      view->data = bytes.data();
      view->space = MemorySpace::kHost;
      KVTRIM_RETURN_IF_ERROR(AsLayerFieldError(CheckFinite(*view, name), name));
    }
    return host;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "keys.shape[2]: d=", layer.shape.head_dim, " is above the GPU kernels' limit of ",
      GpuBackend::kMaxGpuHeadDim, "; such layers run on the CPU, which cannot read cuda_ipc "
      "tensors (send host_shm or inline_data)"));
}

}  // namespace

absl::Status GpuBackend::CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                       const LayerBudget& budget, LayerDecision* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim) {
    std::vector<std::vector<char>> storage;
    auto host = HostOnlyLayer(layer, options_.device, &storage);
    if (!host.ok()) return host.status();
    return host_fallback_->CompressLayer(policy, *host, budget, out);
  }
  Outputs outputs;
  outputs.decision = out;
  const absl::Status status = Run(policy, layer, budget, outputs);
  out->device = options_.device;  // after Run: a host decision replaces *out whole
  if (status.ok()) return RecomputeNonFinitePerturbation(layer, out);
  return status;
}

absl::Status GpuBackend::RecomputeNonFinitePerturbation(const ValidatedLayer& layer,
                                                        LayerDecision* out) {
  if (AllFinite(out->perturbation) || layer.has_device_tensors() || out->output_written) {
    return absl::OkStatus();
  }
  std::vector<std::vector<char>> storage;
  auto host = HostOnlyLayer(layer, options_.device, &storage);
  if (!host.ok()) return host.status();
  host_fallback_->ExactPerturbation(*host, out);
  return absl::OkStatus();
}

absl::Status GpuBackend::CompressByPerturbation(const ResolvedPolicy& policy,
                                                const ValidatedLayer& layer,
                                                const LayerBudget& budget,
                                                const PerturbationSearch& search,
                                                LayerDecision* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim) {
    std::vector<std::vector<char>> storage;
    auto host = HostOnlyLayer(layer, options_.device, &storage);
    if (!host.ok()) return host.status();
    return host_fallback_->CompressByPerturbation(policy, *host, budget, search, out);
  }
  Outputs outputs;
  outputs.decision = out;
  outputs.search = &search;
  const absl::Status status = Run(policy, layer, budget, outputs);
  out->device = options_.device;
  // As CompressLayer: a final fast statistic that overflowed fp32 is recomputed in fp64 where
  // the host can read the tensors (the search counted it as above epsilon).
  if (status.ok()) return RecomputeNonFinitePerturbation(layer, out);
  return status;
}

absl::Status GpuBackend::ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                    const LayerBudget& budget, LayerScores* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim) {
    std::vector<std::vector<char>> storage;
    auto host = HostOnlyLayer(layer, options_.device, &storage);
    if (!host.ok()) return host.status();
    return host_fallback_->ScoreLayer(policy, *host, budget, out);
  }
  Outputs outputs;
  outputs.raw = out;
  const absl::Status status = Run(policy, layer, budget, outputs);
  out->device = options_.device;  // after Run: a host decision replaces *out whole
  return status;
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
  const absl::Status status = Run(policy, layer, budget, outputs);
  out->device = options_.device;
  return status;
}

absl::StatusOr<std::vector<LayerDecision>> GpuBackend::DecideModelWide(
    const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) {
  if (layers.empty()) return std::vector<LayerDecision>();
  std::vector<LayerDecision> decisions;
  KVTRIM_RETURN_IF_ERROR(OnWorker([&](WorkerContext& context) {
    return DecideModelWideOnDevice(context, *score_store_, policy, layers, &decisions);
  }));
  for (LayerDecision& decision : decisions) decision.device = options_.device;
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
  const auto asked = std::chrono::steady_clock::now();
  return OnWorker([&](WorkerContext& context) -> absl::Status {
    const double wait =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
    KVTRIM_RETURN_IF_ERROR(RunLayer(context, policy, layer, budget, outputs));
    // Always: the service's queue stage (kvtrim_stage_duration_seconds{stage="queue"}).
    if (outputs.decision != nullptr) outputs.decision->profile.worker_wait = wait;
    return absl::OkStatus();
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

absl::Status GpuBackend::RunLayer(WorkerContext& context, const ResolvedPolicy& policy,
                                  const ValidatedLayer& layer, const LayerBudget& budget,
                                  const Outputs& outputs) {
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  LayerRun run(context, *model_cache_, score_store_.get(), policy, layer, budget, outputs);
  auto step = Clock::now();
  KVTRIM_RETURN_IF_ERROR(run.Plan());
  const double plan = since(step);
  step = Clock::now();
  KVTRIM_RETURN_IF_ERROR(run.Stage());
  const double stage = since(step);
  step = Clock::now();
  KVTRIM_RETURN_IF_ERROR(run.Enqueue());
  KVTRIM_RETURN_IF_ERROR(run.Fetch());
  if (outputs.decision != nullptr && layer.output.device != nullptr &&
      !outputs.decision->output_written) {
    KVTRIM_RETURN_IF_ERROR(WriteHostDecision(context, layer.output, outputs.decision));
  }
  const double fetch = since(step);
  if (outputs.decision != nullptr && policy.settings.profile) {
    // Fetch wrote the decision: its profile starts from the device stages.
    LayerProfile& profile = outputs.decision->profile;
    profile = run.device_profile();
    profile.plan = plan;
    profile.stage = stage;
    profile.fetch = fetch;
  }
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
