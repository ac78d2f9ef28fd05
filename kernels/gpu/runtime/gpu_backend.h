// The GPU backend: the CPU backend's composition (scorer -> protection -> allocator ->
// selection -> perturbation) as CUDA launches on per-worker streams and memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/gpu/runtime/device_model_cache.h"
#include "kernels/gpu/runtime/device_pool.h"
#include "kernels/gpu/runtime/device_score_buffer.h"
#include "kernels/gpu/runtime/layer_run.h"

namespace kvtrim::gpu {

/// Construction options of GpuBackend.
struct GpuBackendOptions {
  int device = 0;                           // CUDA device ordinal
  int workers = 1;                          // worker contexts = layers computed at once
  size_t arena_limit_bytes = 0;             // cap of each worker's device arena (0 = none)
  size_t staging_chunk_bytes = size_t{8} << 20;  // pinned upload chunk (two per worker)
  /// Launch sequences each worker keeps as CUDA graphs: a layer whose launches repeat (same
  /// shapes, arena regions and input addresses, seen before) is replayed with one
  /// cudaGraphLaunch (launch_graph.h). 0 = every launch issued one by one (the default while
  /// graphs are experimental: docs/gpu.md "Launch graphs").
  size_t launch_graphs = 0;
  /// Device bytes of registered models' per-layer tensors kept between requests (W_O and
  /// Gram matrices of the model-aware scorers, lane-major fp32). 0 = automatic: one worker's
  /// arena cap when arenas are capped, else no cap (least-recently-used tensors are then
  /// evicted only when cudaMalloc fails).
  size_t model_cache_bytes = 0;
  /// Device bytes of model-wide scores kept between layers (ScoreLayerForModelWide: one
  /// [H_kv, n - protected] fp32 buffer per buffered layer, outside the worker arenas, until its
  /// session decides or ends). 0 = automatic: the arenas' cap together (workers x
  /// arena_limit_bytes) when arenas are capped, else no cap but the device's memory.
  size_t score_buffer_bytes = 0;
};

/// Compresses validated layers on one CUDA device. Each call checks a worker context out
/// of a DevicePool (blocking while all are busy), stages K/V/Q from host memory to the
/// device through pinned chunks (asynchronous, on the worker's stream), sizes its working
/// memory with the launchers' *ScratchBytes queries inside the worker's arena, runs the
/// launch sequence of device_pipeline.h and copies offsets, indices and perturbation back.
/// Errors: cudaErrorMemoryAllocation and arena caps -> RESOURCE_EXHAUSTED (the backend
/// stays usable); any other CUDA error -> INTERNAL, and a sticky one (IsStickyCudaError or
/// a stream that stays broken) marks the backend unhealthy for good: healthy() turns false
/// and every later call fails INTERNAL at once. Thread-safe.
class GpuBackend final : public Backend {
 public:
  /// Checks that `options.device` exists, selects it and creates the worker contexts.
  /// Errors: FAILED_PRECONDITION when no CUDA device is visible or the ordinal is out of
  /// range (the message says why); INVALID_ARGUMENT for workers < 1; INTERNAL for CUDA
  /// failures while creating streams.
  /// `host_fallback` (not null) takes the layers over kMaxGpuHeadDim and recomputes an
  /// overflowed fp32 perturbation statistic in fp64; HostFallbackThreads(options) threads
  /// suit it.
  static absl::StatusOr<std::unique_ptr<GpuBackend>> Create(
      const GpuBackendOptions& options, std::unique_ptr<HostFallback> host_fallback);

  /// Threads for the host fallback: the workers, at most the machine's cores, at least 1.
  static int HostFallbackThreads(const GpuBackendOptions& options);

  /// Largest head dimension d the GPU kernels take; larger layers run on the CPU backend
  /// (same canonical arithmetic, so the same answer).
  static constexpr int64_t kMaxGpuHeadDim = 256;

  const char* name() const override { return "gpu"; }
  /// Scores, decides and computes the perturbation on the device: EnqueueLayer (protection,
  /// uniform / pyramid / AdaKV counts, per-head or shared selection) or, for CriticalKV,
  /// LaProx (one layer), LU-KV and the block-aligned / equal-count outputs, EnqueueDecision
  /// (device_decision.h), bit-identical to kernels/decide/decide.h. Only the kept lists come back.
  absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out) override;
  /// Error-targeted budgets: the raw scores come back once, the host runs `search`, and each
  /// of its evaluations uploads the per-head lists and runs the device's perturbation kernels
  /// (exact: LaunchPerturbation, fp64; fast: LaunchFastPerturbation over the rows settings
  /// .perturbation chooses) on the inputs staged once for the call, on one worker. Layers
  /// with d > kMaxGpuHeadDim run on the CPU backend, as in CompressLayer; so does the fp64
  /// recomputation of a final fast statistic that overflowed fp32 (host tensors only).
  /// Errors: CompressLayer's.
  absl::Status CompressByPerturbation(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                      const LayerBudget& budget, const PerturbationSearch& search,
                                      LayerDecision* out) override;
  /// Raw scores [H_kv, n] (no protection) and, for CriticalKV, critical [H_kv, n], copied
  /// back. Same errors as CompressLayer.
  absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                          const LayerBudget& budget, LayerScores* out) override;
  /// LaProx layers (d <= kMaxGpuHeadDim) keep their candidates on the device: out->resident is
  /// a DeviceScoreBuffer [H_kv, n - sink - recent] of the raw scores, divided by the layer's
  /// canonical sum in mode model (as DecideLaProx does), and out->scores stays empty; nothing
  /// is copied back. Other layers: ScoreLayer. Errors: ScoreLayer's, and RESOURCE_EXHAUSTED
  /// when the buffer exceeds GpuBackendOptions::score_buffer_bytes or the device's memory.
  absl::Status ScoreLayerForModelWide(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                      const LayerBudget& budget, LayerScores* out) override;
  /// DecideLaProx on the device (DecideModelWideOnDevice): one segmented top-K over every
  /// layer's candidates, resident or uploaded from host scores; only the kept indices come
  /// back. Bit-identical to DecideLaProx on the same scores. Errors: DecideLaProx's,
  /// FAILED_PRECONDITION for resident scores of another backend, RESOURCE_EXHAUSTED / INTERNAL
  /// as CompressLayer.
  absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(
      const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) override;
  bool healthy() const override { return healthy_.load(); }
  /// What the workers' launch graphs did so far (GpuBackendOptions::launch_graphs).
  LaunchGraphStats launch_graph_stats() const { return pool_->GraphStats(); }
  /// {kFast, kExact} for the scorers with fast kernels (device_pipeline.h HasFastPath: the
  /// attention scorers, d a multiple of 8 up to 256), else {kExact}. A layer whose dtype or
  /// d has no fast path is computed exact, and its decision says so.
  std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                      const AllocatorSpec& allocator) const override;
  /// Device tensors (mapped CUDA IPC regions on this backend's device) are read in place
  /// when dense, gathered on the device when strided / paged.
  bool reads_device_memory() const override { return true; }

  /// Scores alone, protection applied, copied back (the GPU twin of CpuBackend::ScoreLayer,
  /// for tests and diagnostics): scores [H_kv, n] fp32. Same errors as CompressLayer.
  absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                          const LayerBudget& budget, std::vector<float>* scores);

  /// Moves a LaProx layer's host scores (layer->scores [H_kv, n], raw, as ScoreLayer returns
  /// them) into device memory as ScoreLayerForModelWide keeps them (layer->resident set,
  /// layer->scores cleared), for tests and benchmarks of DecideModelWide. Errors: PlanLaProx's,
  /// INVALID_ARGUMENT for scores of the wrong size, ScoreLayerForModelWide's memory errors.
  absl::Status KeepScoresOnDevice(const ResolvedPolicy& policy, LayerScores* layer);

  /// The device cache of model tensors (tests, metrics).
  const DeviceModelCache& model_cache() const { return *model_cache_; }
  /// The device memory of model-wide scores (tests, metrics).
  const DeviceScoreStore& score_store() const { return *score_store_; }

  /// The sticky error that made the backend unhealthy (empty while healthy).
  std::string failure() const;
  /// "NVIDIA H100 80GB HBM3 (device 0, sm_90, 79.1 GiB)".
  const std::string& device_description() const { return description_; }
  /// The options the backend runs with.
  const GpuBackendOptions& options() const { return options_; }

 private:
  explicit GpuBackend(const GpuBackendOptions& options) : options_(options) {}

  /// Serves layers with d > kMaxGpuHeadDim.
  std::unique_ptr<HostFallback> host_fallback_;

  /// What one call computes (layer_run.h).
  using Outputs = RunOutputs;

  /// After a successful run: a fast statistic that overflowed fp32 (finite inputs near
  /// 1e19: NaN) is recomputed in fp64 on the host where the host can read the tensors (host
  /// and host shm tensors; a cuda_ipc layer keeps its NaN, which the metrics skip).
  absl::Status RecomputeNonFinitePerturbation(const ValidatedLayer& layer, LayerDecision* out);

  /// Runs one layer on a checked-out context (its device current) into `outputs`: a LayerRun's
  /// Plan, Stage, Enqueue and Fetch.
  absl::Status RunLayer(WorkerContext& context, const ResolvedPolicy& policy,
                        const ValidatedLayer& layer, const LayerBudget& budget,
                        const Outputs& outputs);
  /// Checks a context out, runs RunLayer and classifies a failure (HandleFailure).
  absl::Status Run(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                   const LayerBudget& budget, const Outputs& outputs);
  /// Checks the backend's health, checks a context out (blocking while all are busy), makes
  /// the device current and runs `work` on the context; a failure goes to HandleFailure.
  absl::Status OnWorker(const std::function<absl::Status(WorkerContext&)>& work);
  /// Classifies a failed call: marks the backend unhealthy when the CUDA error is sticky.
  void HandleFailure(WorkerContext& context, const absl::Status& status);
  /// INTERNAL "must be restarted" once a sticky error made the backend unhealthy, else OK.
  absl::Status CheckHealthy() const;

  GpuBackendOptions options_;
  std::string description_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<DeviceModelCache> model_cache_;
  std::shared_ptr<DeviceScoreStore> score_store_;  // shared with the buffers it made
  std::atomic<bool> healthy_{true};
  mutable std::mutex failure_mutex_;
  std::string failure_;  // guarded by failure_mutex_
};

}  // namespace kvtrim::gpu
