// One layer on one worker context, in the four steps of the GPU runtime:
//   Plan     the LayerPlan (device_pipeline.h), the registered model's device tensors
//            (DeviceModelCache) and Expected Attention's statistics (host);
//   Stage    the arena and pinned-buffer layouts, the inputs on the device (host tensors
//            uploaded, CUDA IPC tensors read in place or gathered and NaN-probed on the
//            worker's side stream, beside the kernels), the meta region, the statistics and
//            the device decision's upload;
//   Enqueue  the launches on the worker's stream, nothing synchronised (repeatable: the
//            benchmark times it between CUDA events);
//   Fetch    the copies back, one synchronisation, the input probes' verdict, NaN checks,
//            and the answer.
// GpuBackend runs the four in order; kvtrim_gpu_bench plans and stages once and times Enqueue.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/decide/decide.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/runtime/device_decision.h"
#include "kernels/gpu/runtime/device_input_stage.h"
#include "kernels/gpu/runtime/device_model_cache.h"
#include "kernels/gpu/runtime/device_pipeline.h"
#include "kernels/gpu/runtime/device_pool.h"
#include "kernels/gpu/runtime/device_score_buffer.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim::gpu {

/// What a run answers; exactly one output is set (`search` comes with `decision`).
struct RunOutputs {
  LayerDecision* decision = nullptr;               // kept lists (+ perturbation): CompressLayer
  /// With `decision`: an error-targeted budget's search decides the layer on the host from
  /// its raw scores, each of its evaluations one perturbation launch on the staged inputs
  /// (CompressByPerturbation).
  const PerturbationSearch* search = nullptr;
  std::vector<float>* protected_scores = nullptr;  // [H_kv, n] protected scores (diagnostics)
  LayerScores* raw = nullptr;                      // raw scores (+ critical): ScoreLayer
  LayerScores* resident = nullptr;                 // LaProx candidates kept on the device
  bool normalize = false;                          // resident: divide by the layer's sum
};

/// One layer's run. Holds the plan, the model tensors it reads (alive until Fetch has
/// synchronised), the arena / pinned layouts and the device pointers of the layer; the
/// arena and pinned buffers are the worker context's. Not thread-safe; one run at a time per
/// context (several planned runs of equal layouts may share it, as the benchmark's input
/// sets do).
class LayerRun {
 public:
  /// A run of `layer` under `policy` and `budget` into `outputs` (the pointers must outlive
  /// the run). `cache` serves the model tensors; `store` the resident score buffers (may be
  /// null unless outputs.resident).
  LayerRun(WorkerContext& context, DeviceModelCache& cache, DeviceScoreStore* store,
           const ResolvedPolicy& policy, const ValidatedLayer& layer, const LayerBudget& budget,
           const RunOutputs& outputs);

  /// Builds the plan and fetches the model inputs. Errors: PlanLayer's; FAILED_PRECONDITION
  /// without the model a scorer needs; INVALID_ARGUMENT for heads that do not match it; the
  /// cache's upload errors; Expected Attention's statistics errors.
  absl::Status Plan();
  /// Lays out and reserves the arena and pinned buffers and moves the inputs, meta region,
  /// statistics and decision upload to the device. Errors: the arena's RESOURCE_EXHAUSTED,
  /// the input stage's NaN / CUDA errors.
  absl::Status Stage();
  /// Enqueues the layer's launches and (with `copy_back`) the device-to-host copies of the
  /// answer on the worker's stream; `events` marks the scorer's and the selection's end when
  /// given. Repeatable: the benchmark times it without the copies, then enqueues once more
  /// with them before Fetch.
  absl::Status Enqueue(const PipelineEvents* events = nullptr, bool copy_back = true);
  /// Synchronises and fills the output: decisions (host-decided layers decide here, then run
  /// the perturbation), scores, or the resident buffer. Errors: NaN scores (INVALID_ARGUMENT
  /// worded as the CPU's), inconsistent results (INTERNAL), CUDA errors.
  absl::Status Fetch();

  /// The plan (after Plan).
  const LayerPlan& plan() const { return plan_; }
  /// Device bytes of the layer's working set (after Stage).
  size_t arena_bytes() const { return layout_.total(); }
  /// With settings.profile on a decision: the device stages of the layer, timed by the
  /// worker's StageEvents (LayerProfile's device fields, after Fetch; zero otherwise).
  const LayerProfile& device_profile() const { return device_profile_; }

 private:
  /// Where each piece of the pinned transfer buffer sits.
  struct PinnedLayout {
    size_t meta = 0, offsets = 0, indices = 0, perturbation = 0, first_nan = 0;
    size_t scores = 0, critical = 0, ea_mean = 0, ea_cov = 0, decision = 0, critical_nan = 0;
    size_t probes = 0;  // three words: the inputs' NaN / Inf probes (DeviceInputStage)
    size_t finite_flag = 0;  // one word the scorer sets on a NaN / Inf it reads (fused check)
  };

  /// Model tensors of the plan from the cache, and Expected Attention's statistics.
  absl::Status PlanModelInputs();
  /// Enqueue's launches (EnqueueDecision or EnqueueLayer, then the copies back when
  /// `copy_back`), issued one by one: Enqueue runs them directly or through the worker's
  /// launch graphs.
  absl::Status EnqueueLaunches(const PipelineEvents* events, bool copy_back);
  /// Whether the kept lists go device to device into the layer's output target (a device
  /// target, on a layer decided on the device) instead of coming back.
  bool writes_output() const;
  /// Enqueues that write and the worker's done event (after the launches; no-op otherwise).
  absl::Status EnqueueOutputWrite();
  /// Enqueues the copy of a device word into the pinned buffer at `at`.
  absl::Status CopyBack(size_t at, const void* device, size_t bytes);
  /// Enqueue / Fetch of the resident LaProx candidates.
  absl::Status EnqueueResident();
  absl::Status FetchResident();
  /// Enqueue / Fetch of scores copied back (ScoreLayer, and host-decided layers).
  absl::Status EnqueueDownload();
  absl::Status FetchDownload();
  /// Fetch of a layer decided on the device.
  absl::Status FetchDecision();
  /// The host decision's lists back on the device and the perturbation on them.
  absl::Status HostDecisionPerturbation(LayerDecision* out);
  /// The statistic of host lists (offsets [L + 1], L = 1 or H_kv; indices) on the staged
  /// layer: uploaded, one perturbation launch, out [H_kv] copied back (synchronised).
  absl::Status ListsPerturbation(const std::vector<int64_t>& offsets,
                                 const std::vector<int32_t>& indices, std::vector<double>* out);
  /// FetchDownload's end for an error-targeted budget: outputs_.search over the raw scores
  /// with a probe of ListsPerturbation, then the decision's numerics and rows.
  absl::Status SearchOnHost(std::vector<float> scores, std::vector<float> critical);
  /// A typed view of the pinned buffer at `at`.
  template <typename T>
  std::vector<T> Pinned(size_t at, size_t count) const;

  WorkerContext& context_;
  DeviceModelCache& cache_;
  DeviceScoreStore* store_;
  const ResolvedPolicy& policy_;
  const ValidatedLayer& layer_;
  const LayerBudget& budget_;
  RunOutputs outputs_;

  LayerPlan plan_;
  bool device_decision_ = false;  // a host_decide layer decided by EnqueueDecision
  bool download_ = false;         // scores come back to the host
  DeviceModelInputs model_inputs_;
  FastModelInputs fast_inputs_;
  std::vector<std::shared_ptr<const DeviceModelTensor>> held_;  // until Fetch synchronises
  std::vector<float> ea_mean_, ea_cov_;                         // lane-major host images

  ArenaLayout layout_;
  DeviceInputStage inputs_;
  PipelineRegions regions_;
  DecisionRegions decision_regions_;
  size_t normalize_at_ = 0, normalize_bytes_ = 0;
  int64_t width_ = 0;  // resident candidates per head: n - sink - recent
  DeviceLayer device_layer_;
  PipelineBuffers buffers_;
  DecisionBuffers decision_buffers_;
  PinnedLayout pinned_;
  std::shared_ptr<DeviceScoreBuffer> resident_;
  bool profiled_ = false;  // settings.profile on a decision: the worker's StageEvents record
  LayerProfile device_profile_;
};

}  // namespace kvtrim::gpu
