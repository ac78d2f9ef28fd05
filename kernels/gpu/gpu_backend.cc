#include "kernels/gpu/gpu_backend.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/device_error.h"
#include "kernels/gpu/device_nan_probe.h"
#include "kernels/gpu/device_pipeline.h"
#include "kernels/gpu/device_probe.h"

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
  return backend;
}

std::string GpuBackend::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

absl::Status GpuBackend::CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                       const LayerBudget& budget, LayerDecision* out) {
  if (layer.shape.head_dim > kMaxGpuHeadDim) {
    return cpu_fallback_->CompressLayer(policy, layer, budget, out);
  }
  return Run(policy, layer, budget, out, nullptr);
}

absl::Status GpuBackend::ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                    const LayerBudget& budget, std::vector<float>* scores) {
  return Run(policy, layer, budget, nullptr, scores);
}

absl::Status GpuBackend::Run(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out,
                             std::vector<float>* scores) {
  if (!healthy()) {
    return absl::InternalError(absl::StrCat(
        "the GPU backend is out of service after a sticky CUDA error (", failure(),
        "); kvtrimd must be restarted"));
  }
  DevicePool::Lease lease = pool_->Acquire();
  absl::Status status = RunLayer(*lease, policy, layer, budget, out, scores);
  if (!status.ok()) HandleFailure(*lease, status);
  return status;
}

absl::Status GpuBackend::RunLayer(WorkerContext& context, const ResolvedPolicy& policy,
                                  const ValidatedLayer& layer, const LayerBudget& budget,
                                  LayerDecision* out, std::vector<float>* scores) {
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  cudaGetLastError();  // a stale non-sticky error of this thread is not ours
  const LayerShape& shape = layer.shape;
  const DType dtype = layer.keys.dtype;
  absl::StatusOr<LayerPlan> plan =
      PlanLayer(policy, shape, dtype, layer.layer_id, layer.num_layers, budget);
  if (!plan.ok()) return plan.status();

  // Device working set: inputs first, then the pipeline's regions.
  ArenaLayout layout;
  const size_t key_bytes = plan->reads_keys ? static_cast<size_t>(layer.keys.nbytes()) : 0;
  const size_t value_bytes = plan->reads_values ? static_cast<size_t>(layer.values.nbytes()) : 0;
  const size_t query_bytes =
      plan->reads_queries ? static_cast<size_t>(layer.queries.nbytes()) : 0;
  const size_t keys_at = layout.Add(key_bytes);
  const size_t values_at = layout.Add(value_bytes);
  const size_t queries_at = layout.Add(query_bytes);
  // The scratch queries read shapes only, but reject null tensors: size the regions on a
  // placeholder address (never dereferenced) before the arena's base is known.
  static const char kPlaceholder = 0;
  const DeviceLayer sizing =
      MakeDeviceLayer(*plan, shape, dtype, layer.softmax_scale, layer.layer_id, layer.seed,
                      &kPlaceholder, &kPlaceholder, &kPlaceholder);
  const PipelineRegions regions = AddPipelineRegions(*plan, sizing, &layout);
  KVTRIM_RETURN_IF_ERROR(context.arena().Reserve(layout.total()));
  char* base = static_cast<char*>(context.arena().data());
  const DeviceLayer device_layer =
      MakeDeviceLayer(*plan, shape, dtype, layer.softmax_scale, layer.layer_id, layer.seed,
                      base + keys_at, base + values_at, base + queries_at);
  const PipelineBuffers buffers = ResolveBuffers(*plan, regions, base);

  // Pinned transfer buffer: [meta upload | offsets | indices | perturbation | first NaN].
  const std::vector<int64_t> meta = MetaInit(*plan);
  const size_t lists = static_cast<size_t>(plan->num_lists());
  const size_t heads = static_cast<size_t>(shape.num_kv_heads);
  const size_t total = static_cast<size_t>(plan->total_indices);
  ArenaLayout host;
  const size_t meta_at = host.Add(meta.size() * sizeof(int64_t));
  const size_t offsets_at = host.Add((lists + 1) * sizeof(int64_t));
  const size_t indices_at = host.Add(total * sizeof(int32_t));
  const size_t perturbation_at = host.Add(heads * sizeof(double));
  const size_t nan_at = host.Add(sizeof(unsigned long long));
  const size_t scores_at =
      host.Add(scores != nullptr ? heads * static_cast<size_t>(shape.num_tokens) * sizeof(float)
                                 : 0);
  KVTRIM_RETURN_IF_ERROR(context.transfer().Reserve(host.total()));
  char* pinned = context.transfer().data();

  // Uploads: K/V/Q through the staging chunks; the meta region from the transfer buffer.
  cudaStream_t stream = context.stream();
  if (key_bytes) {
    KVTRIM_RETURN_IF_ERROR(context.Upload(base + keys_at, layer.keys.data, key_bytes));
  }
  if (value_bytes) {
    KVTRIM_RETURN_IF_ERROR(context.Upload(base + values_at, layer.values.data, value_bytes));
  }
  if (query_bytes) {
    KVTRIM_RETURN_IF_ERROR(context.Upload(base + queries_at, layer.queries.data, query_bytes));
  }
  std::memcpy(pinned + meta_at, meta.data(), meta.size() * sizeof(int64_t));
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers.counts, pinned + meta_at,
                                              meta.size() * sizeof(int64_t),
                                              cudaMemcpyHostToDevice, stream),
                              "cudaMemcpyAsync(meta)");

  if (scores != nullptr) {  // scores alone
    const size_t score_bytes = heads * static_cast<size_t>(shape.num_tokens) * sizeof(float);
    KVTRIM_RETURN_IF_ERROR(EnqueueScores(*plan, device_layer, buffers, stream));
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + scores_at, buffers.scores, score_bytes,
                                                cudaMemcpyDeviceToHost, stream),
                                "cudaMemcpyAsync(scores)");
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + nan_at, buffers.first_nan,
                                                sizeof(unsigned long long),
                                                cudaMemcpyDeviceToHost, stream),
                                "cudaMemcpyAsync(first_nan)");
    KVTRIM_RETURN_IF_ERROR(context.Synchronize());
    unsigned long long first_nan = 0;
    std::memcpy(&first_nan, pinned + nan_at, sizeof first_nan);
    KVTRIM_RETURN_IF_ERROR(NaNStatus(*plan, first_nan));
    const auto* values = reinterpret_cast<const float*>(pinned + scores_at);
    scores->assign(values, values + score_bytes / sizeof(float));
    return absl::OkStatus();
  }
  KVTRIM_RETURN_IF_ERROR(EnqueueLayer(*plan, device_layer, buffers, stream));

  // Downloads, then one synchronisation.
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
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + nan_at, buffers.first_nan,
                                              sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                              stream),
                              "cudaMemcpyAsync(first_nan)");
  KVTRIM_RETURN_IF_ERROR(context.Synchronize());

  HostResults results;
  const auto* offsets = reinterpret_cast<const int64_t*>(pinned + offsets_at);
  results.offsets.assign(offsets, offsets + lists + 1);
  const auto* indices = reinterpret_cast<const int32_t*>(pinned + indices_at);
  results.indices.assign(indices, indices + total);
  if (plan->perturbation) {
    const auto* perturbation = reinterpret_cast<const double*>(pinned + perturbation_at);
    results.perturbation.assign(perturbation, perturbation + heads);
  }
  std::memcpy(&results.first_nan, pinned + nan_at, sizeof(unsigned long long));
  KVTRIM_RETURN_IF_ERROR(FinishDecision(*plan, layer.layer_id, std::move(results), out));
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
