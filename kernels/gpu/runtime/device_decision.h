// Decisions on the device for the layers EnqueueLayer does not decide (LayerPlan::host_decide):
// CriticalKV's two stages (any allocator), the lukv allocator, BLOCK_ALIGNED and EQUAL_COUNT
// outputs, and LaProx one layer at a time (CompressLayer) or over every buffered layer
// (DecideModelWide). The launch sequences reproduce DecideLayer / DecideLaProx
// (kernels/decide/decide.h) exactly, with the launchers of launchers.h (AdaKV counts, the fused
// per-head top-k, the shared round robin) and of device_decide.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/decide/decide.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/kernels/device_decide.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim::gpu {

struct LayerPlan;
struct PipelineBuffers;
struct PipelineEvents;
class WorkerContext;
class DeviceScoreStore;

/// Which decision a host_decide layer gets on the device.
enum class DecisionKind {
  kNone,    // none: DecideOnHost (a lukv layer whose budgets cannot be computed: the host
            // reports the error in the CPU backend's order)
  kLayer,   // DecideLayer: protection, counts, CriticalKV's stages, the output shape
  kLaProx,  // DecideLaProx over this layer alone
};

/// The host part of a device decision, resolved by PlanDeviceDecision.
struct DecisionPlan {
  DecisionKind kind = DecisionKind::kNone;
  OutputShape shape = OutputShape::kPerHead;
  std::vector<int64_t> sink;    // [H_kv] protected tokens per head (lukv: clamped per head)
  std::vector<int64_t> recent;  // [H_kv]
  int64_t max_protected = 0;    // the largest of sink and recent
  bool adakv = false;           // counts from LaunchAdaKVCounts (else LayerPlan::counts)
  int64_t adakv_k = 0;
  int64_t adakv_safeguard = 0;
  int64_t stage1_capacity = 0;  // CriticalKV: room for the stage-1 lists (indices)
  bool critical = false;        // CriticalKV: stage 1 by attention, stage 2 by LayerPlan's
                                // critical scores
  double alpha = 0;             // CriticalKV's stage-1 share
  int64_t block_size = 0;       // BLOCK_ALIGNED
  int64_t num_blocks = 0;       // ceil(n / block_size)
  int64_t wanted_blocks = 0;    // blocks kept
  LaProxPlan laprox;            // kLaProx
  int64_t laprox_keep = 0;      // kLaProx: candidates each head would keep, k - sink - recent
};

/// Fills plan->decision for a host_decide layer from the policy and the layer's budget, as
/// DecideLayer / DecideLaProx would decide it, and the LayerPlan fields the device answer
/// needs (counts, shared / block, shared_count, total_indices, output_shape). Leaves kind
/// kNone (the host path) when AllocateCounts fails. Called by PlanLayer.
void PlanDeviceDecision(const ResolvedPolicy& policy, const LayerShape& shape, int32_t layer_id,
                        int32_t num_layers, const LayerBudget& budget, LayerPlan* plan);

/// Offsets of a device decision's own regions inside the arena (after PipelineRegions).
struct DecisionRegions {
  size_t upload = 0;          // per-head protection [2, H_kv] int64, or LaProx's tables
  size_t upload_bytes = 0;
  size_t stage1_counts = 0;   // [H_kv] int64
  size_t stage1_offsets = 0;  // [H_kv + 1] int64
  size_t stage1_indices = 0;  // [stage1_capacity] int32
  size_t slots = 0;           // two unsigned long long: CriticalKV's first NaN, a spare probe
  size_t block_scores = 0;    // [H_kv, num_blocks] fp32
  size_t chosen = 0;          // [wanted_blocks] int32
  size_t scratch = 0;
  size_t scratch_bytes = 0;   // the largest query of the launchers this decision runs
};

/// Plans the regions of `plan`'s decision after whatever `layout` holds.
DecisionRegions AddDecisionRegions(const LayerPlan& plan, ArenaLayout* layout);

/// Device pointers of the decision regions.
struct DecisionBuffers {
  char* upload = nullptr;
  size_t upload_bytes = 0;
  int64_t* sink = nullptr;            // [H_kv] (kLayer)
  int64_t* recent = nullptr;          // [H_kv] (kLayer)
  int64_t* stage1_counts = nullptr;
  int64_t* stage1_offsets = nullptr;
  int32_t* stage1_indices = nullptr;
  unsigned long long* critical_nan = nullptr;  // the first NaN of the critical scores
  unsigned long long* spare_nan = nullptr;     // probes nobody reads (the fused top-k's)
  float* block_scores = nullptr;
  int32_t* chosen = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

/// Resolves `regions` against the arena start `base`.
DecisionBuffers ResolveDecisionBuffers(const LayerPlan& plan, const DecisionRegions& regions,
                                       void* base);

/// The bytes the upload region must hold before EnqueueDecision (kLayer: the per-head
/// protection; kLaProx: the candidate tables, which point into buffers.scores).
std::vector<char> DecisionUpload(const LayerPlan& plan, const PipelineBuffers& buffers,
                                 const DecisionBuffers& decision);

/// Enqueues the whole host_decide layer on `stream`: EnqueueRawScores, the decision
/// (DecideLayer's or DecideLaProx's order of operations) into buffers.offsets / indices, and
/// the perturbation when planned. The meta region must hold MetaInit(plan) and the upload
/// region DecisionUpload(...) in stream order. Errors: CudaStatus() of the first failing launch.
absl::Status EnqueueDecision(const LayerPlan& plan, const DeviceLayer& layer,
                             const PipelineBuffers& buffers, const DecisionBuffers& decision,
                             cudaStream_t stream, const PipelineEvents* events = nullptr);

/// The NaN check of a device decision, in the CPU backend's order: the raw scores' first NaN
/// (NaNStatus), then the critical scores'.
absl::Status DecisionNaNStatus(const LayerPlan& plan, unsigned long long first_nan,
                               unsigned long long critical_nan);

// ---- LaProx candidate tables ------------------------------------------------------------------

/// One layer's candidates for LaunchSelectCandidates: head h's scores at values + h * pitch.
struct CandidateSource {
  const float* values = nullptr;  // device
  int64_t pitch = 0;              // floats from one head's candidates to the next
  int64_t num_heads = 0;
  int64_t width = 0;              // candidates per head: n - sink - recent
  int64_t sink = 0;
  int64_t recent = 0;
  int64_t keep = 0;               // candidates a head would keep: k - sink - recent
};

/// The tables of LaunchSelectCandidates for layers in order (heads, tiles, segments by
/// `scope`) and the totals of the answer.
struct CandidateTables {
  std::vector<CandidateHead> heads;
  std::vector<CandidateTile> tiles;
  std::vector<CandidateSegment> segments;
  int64_t protected_total = 0;  // sink + recent summed over the heads
  int64_t kept_total = 0;       // candidates kept, the sum of the segments' keeps
  /// Indices of the answer: protected_total + kept_total.
  int64_t total() const { return protected_total + kept_total; }
  /// Bytes of the three tables laid out by WriteCandidateTables.
  size_t bytes() const;
};

/// Builds the tables (DecideLaProx's budgets: per head k - protected, per layer H_kv times
/// that, or their sum over the model, each clamped to the candidates it ranges over).
CandidateTables BuildCandidateTables(const std::vector<CandidateSource>& sources,
                                     LaProxScope scope);

/// Device pointers of the tables once `tables` was copied to `device` (kArenaAlignment-aligned
/// sections: heads, tiles, segments).
struct CandidateTablePointers {
  const CandidateHead* heads = nullptr;
  const CandidateTile* tiles = nullptr;
  const CandidateSegment* segments = nullptr;
};

/// Where the tables lie once their bytes (WriteCandidateTables) are copied to `device`.
CandidateTablePointers PlaceCandidateTables(const CandidateTables& tables, char* device);

/// Writes the tables' bytes into `out` (tables.bytes() of them) and returns where they will
/// lie once copied to `device`.
CandidateTablePointers WriteCandidateTables(const CandidateTables& tables, char* out,
                                            char* device);

/// Enqueues LaunchSelectCandidates over copied tables.
absl::Status EnqueueSelectCandidates(const CandidateTables& tables,
                                     const CandidateTablePointers& device, int64_t* head_start,
                                     int32_t* indices, void* scratch, size_t scratch_bytes,
                                     cudaStream_t stream);

// ---- Model-wide decision ---------------------------------------------------------------------

/// DecideLaProx on the device over `layers` (LayerScores::resident buffers of `store`, or host
/// scores, which are uploaded): one segmented top-K on `context`'s stream and arena, the kept
/// indices copied back once. Fills one decision per layer, in order, with the layer's numerics
/// and no perturbation. Errors: PlanLaProx's; FAILED_PRECONDITION for scores another backend
/// kept or kept for another laprox mode; INVALID_ARGUMENT for host scores of the wrong size;
/// the arena's RESOURCE_EXHAUSTED; CudaStatus() of a failing launch or copy.
absl::Status DecideModelWideOnDevice(WorkerContext& context, const DeviceScoreStore& store,
                                     const ResolvedPolicy& policy,
                                     const std::vector<LayerScores>& layers,
                                     std::vector<LayerDecision>* out);

}  // namespace kvtrim::gpu
