// The GPU launch sequence of one layer, shared by GpuBackend and kvtrim_gpu_bench:
// scorer -> NaN probe -> protection -> allocator (host counts or AdaKV) -> selection
// (per-head top-k or shared) -> perturbation. Mirrors CpuBackend::CompressLayer. Per-head
// lists with host counts (uniform, pyramid) run the NaN probe, protection and top-k as one
// launch (LaunchProtectSelectTopK).
// Decisions EnqueueLayer does not make (CriticalKV's two stages, LaProx, LU-KV budgets,
// block-aligned and equal-count outputs: LayerPlan::host_decide) are made on the device by
// EnqueueDecision (device_decision.h), which reproduces kernels/decide/decide.h exactly;
// DecideOnHost (the raw scores copied back, kernels/decide/decide.h on the host) remains for
// the layers it cannot plan (DecisionKind::kNone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "kernels/decide/decide.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/runtime/device_decision.h"
#include "kernels/gpu/runtime/launch_graph.h"
#include "kernels/gpu/kernels/fast_model.cuh"
#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim::gpu {

/// Everything the launches of one layer need, resolved on the host from the policy, the
/// layer's shape and its budget, exactly as CpuBackend::CompressLayer decides it.
struct LayerPlan {
  std::string scorer_name;
  ScorerKind scorer = ScorerKind::kTable;
  const GpuScorer* table_scorer = nullptr;  // kTable: its kernels (GpuScorerTable::Builtin)
  ScorerParams params;            // params.fast: the scorer runs its fast kernels
  Numerics numerics = Numerics::kExact;  // the mode that computes the scores (fast when the
                                         // request asks for it and the scorer has a fast path
                                         // for this dtype and d, else exact)
  Protection protection;          // clamped sink / recent, identical for every head
  int32_t num_heads = 0;          // H_kv
  int64_t num_tokens = 0;         // n
  bool adakv = false;             // counts from LaunchAdaKVCounts (per-head output only)
  int64_t adakv_k = 0;            // uniform per-head budget k
  int64_t adakv_safeguard = 0;    // min(n, floor(alpha * k))
  std::vector<int64_t> counts;    // [H_kv] host counts (uniform / pyramid); empty for adakv
  bool shared = false;            // one list for every head (SelectSharedRoundRobin)
  int64_t shared_count = 0;       // length of the shared list
  int64_t total_indices = 0;      // indices the selection writes (sum of counts, or shared)
  bool perturbation = false;      // values and queries present: compute the statistic
  int32_t perturbation_rows = 0;  // the last window rows per query head it averages (all w,
                                  // or kSampledPerturbationRows when sampled in fast numerics)
  bool perturbation_sampled = false;  // perturbation_rows < w
  bool reads_keys = true;         // the scorer or the statistic reads K (not StreamingLLM
                                  // or Random alone)
  bool reads_values = false;      // the scorer or the statistic reads V
  bool reads_queries = false;     // the scorer or the statistic reads Q
  // Model-aware scorers (LaunchModelScore) and host-decided layers.
  bool model_scorer = false;      // criticalkv, laprox, expected_attention
  bool host_decide = false;       // not decided by EnqueueLayer: EnqueueDecision decides it on
                                  // the device (decision.kind set), else DecideOnHost
  bool critical = false;          // criticalkv: a second score array (stage 2)
  bool needs_w_o = false;         // the model tensors the scorer reads
  bool needs_w_o16 = false;       // criticalkv l1 in fast numerics: ModelTensor::kWoF16
  bool needs_head_gram = false;
  bool needs_group_gram = false;
  bool needs_ea_stats = false;    // expected_attention: per-layer mean / covariance upload
  int32_t model_query_heads = 0;  // the model's H_q (EA statistics regions)

  // Device decisions of host_decide layers (device_decision.h).
  OutputShape output_shape = OutputShape::kPerHead;  // the shape of the answer
  bool block = false;             // one BLOCK_ALIGNED list of at most total_indices tokens
  DecisionPlan decision;          // kind kNone unless EnqueueDecision decides the layer

  /// Lists the selection writes: H_kv per head, 1 shared or block-aligned.
  int32_t num_lists() const { return shared || block ? 1 : num_heads; }
  /// No kept list is longer: the host counts' largest or the shared list's length where the
  /// host knows them, else n (AdaKV, host-decided layers).
  int64_t kept_bound() const;
};

/// True when `scorer` has fast-numerics kernels for `dtype` and head dimension `head_dim`
/// (the model-aware scorers: fast_model.cuh FastModelSupported, every norm / gqa parameter;
/// a table scorer: its fast kernels' Supports).
bool HasFastPath(const ScorerSpec& scorer, DType dtype, int64_t head_dim);

/// Builds the plan: scorer kind and ScorerParams read from the resolved parameters as the
/// CPU scorers read them (dropkv bf16_prob_round "auto" = on iff `dtype` is bf16; keydiff
/// anchor; pooling max/avg), counts from the allocator (uniform; pyramid through
/// PyramidLayerBudget on the host; adakv on the device), the output shape and whether the
/// perturbation statistic runs. Host-decided layers (criticalkv, laprox, allocator lukv,
/// outputs block_aligned / equal_count) get a device decision (PlanDeviceDecision: its counts
/// and indices); one it cannot plan keeps no counts and an indices region of H_kv * n for the
/// perturbation upload. model_query_heads comes from policy.model (else the layer's
/// H_q). Errors: UNIMPLEMENTED for a scorer or allocator without a GPU path; INVALID_ARGUMENT
/// for parameter values the CPU scorers reject too.
absl::StatusOr<LayerPlan> PlanLayer(const ResolvedPolicy& policy, const LayerShape& shape,
                                    DType dtype, int32_t layer_id, int32_t num_layers,
                                    const LayerBudget& budget);

/// Narrows a plan to scoring alone (ScoreLayer): no perturbation, and only the tensors the
/// scorer itself reads.
void PlanScoresOnly(const ResolvedPolicy& policy, const LayerShape& shape, LayerPlan* plan);

/// Narrows a plan to an error-targeted budget's search (GpuBackend::CompressByPerturbation):
/// the scores come back raw, the host's search decides, and each of its per-head lists goes
/// back to the device for the statistic: host_decide, no allocator or device decision, one
/// list per head and an indices region of H_kv * n for the uploads.
void PlanPerturbationSearch(LayerPlan* plan);

/// Bits of the inputs (1 keys, 2 values) that the layer's scorer launch checks for NaN / Inf
/// itself when DeviceLayer::finite_flag is set: the window-attention table scorers
/// (GpuScorer::window_attention) on LaunchScore's fast plan, on 16-bit inputs, read every
/// element of K in their pass A, and those that read values (DropKV) every element of V too.
/// 0 for every other plan.
uint32_t FusedFiniteInputs(const LayerPlan& plan, const DeviceLayer& layer);

/// A DeviceLayer over device tensors (V and Q only when the plan reads them; nullptr
/// pointers and zero query dims otherwise). `keys` is passed even when the plan does not
/// read K (the launchers never dereference it then).
DeviceLayer MakeDeviceLayer(const LayerPlan& plan, const LayerShape& shape, DType dtype,
                            float softmax_scale, int32_t layer_id, uint64_t seed,
                            const void* keys, const void* values, const void* queries);

/// Offsets of one layer's working regions inside an arena (see ArenaLayout).
struct PipelineRegions {
  size_t scores = 0;        // [H_kv, n] fp32
  size_t meta = 0;          // int64: counts [H_kv], offsets [num_lists + 1], first NaN [1]
  size_t indices = 0;       // [max(total_indices, 1)] int32
  size_t perturbation = 0;  // [H_kv] double
  size_t first_nan = 0;     // one unsigned long long: the last value of the meta region
  size_t critical = 0;      // [H_kv, n] fp32 (criticalkv)
  size_t ea_mean = 0;       // [model H_q, 8E] fp32 (expected_attention)
  size_t ea_cov = 0;        // [model H_q, d, 8E] fp32 (expected_attention)
  size_t scratch = 0;       // scratch_bytes
  size_t scratch_bytes = 0; // max of the launchers' *ScratchBytes queries
  /// The fast DropKV scorer's row outputs kept for the perturbation statistic when its rows
  /// are the statistic's (FastScorerRowsBytes; 0 bytes otherwise), copied from this offset
  /// in the scratch right after the scorer.
  size_t full_rows = 0;
  size_t full_rows_bytes = 0;
  size_t full_rows_from = 0;
};

/// Plans the working regions of `plan` for `layer` after whatever `layout` holds already.
/// The launchers' *ScratchBytes queries read only shapes, but return 0 for null tensors:
/// `layer` must carry non-null pointers for the tensors the plan reads.
PipelineRegions AddPipelineRegions(const LayerPlan& plan, const DeviceLayer& layer,
                                   ArenaLayout* layout);

/// Device pointers of the working regions.
struct PipelineBuffers {
  float* scores = nullptr;                  // [H_kv, n]
  int64_t* counts = nullptr;                // [H_kv]
  int64_t* offsets = nullptr;               // [num_lists + 1]
  int32_t* indices = nullptr;               // [total_indices]
  double* perturbation = nullptr;           // [H_kv]
  unsigned long long* first_nan = nullptr;  // [1]
  float* critical = nullptr;                // [H_kv, n] (criticalkv)
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  /// The scorer's row outputs for the perturbation statistic (PipelineRegions::full_rows):
  /// null when the statistic computes its own.
  void* full_rows = nullptr;
  size_t full_rows_bytes = 0;
  const void* full_rows_from = nullptr;  // inside scratch
  /// Model inputs of LaunchModelScore: ResolveBuffers points ea_mean / ea_cov at the arena;
  /// the caller sets the cached model tensors, hidden, num_query_heads and half_scale2.
  DeviceModelInputs model;
  /// Model inputs of LaunchFastModelScore besides `model` (plan.params.fast): the caller sets
  /// w_o16 (ModelTensor::kWoF16) when plan.needs_w_o16.
  FastModelInputs fast_model;
};

/// Resolves `regions` against the arena start `base`.
PipelineBuffers ResolveBuffers(const LayerPlan& plan, const PipelineRegions& regions, void* base);

/// The int64 values the meta region must hold before EnqueueLayer: [H_kv] host counts
/// (zeros for adakv) followed by the offsets (shared: {0, shared_count}; per head: zeros,
/// written by the top-k) and the first-NaN slot (kNoNaN, which LaunchProtectSelectTopK lowers;
/// the separate NaN probe resets it itself).
std::vector<int64_t> MetaInit(const LayerPlan& plan);

/// Events EnqueueLayer records between phases (benchmarks); null members are skipped.
struct PipelineEvents {
  cudaEvent_t after_score = nullptr;   // after the scorer (and, unless the selection is the
                                       // fused one, the NaN probe and protection)
  cudaEvent_t after_select = nullptr;  // after the counts and the selection (the fused
                                       // selection: NaN probe, protection and top-k)
};

/// Scratch bytes of the output perturbation of `plan` over `layer`: the fast kernel's
/// (LaunchFastPerturbation) in fast numerics where it takes the layer, else the fp64 one's.
size_t PerturbationBytes(const LayerPlan& plan, const DeviceLayer& layer);

/// Enqueues the output perturbation of the lists (offsets [num_lists + 1], indices) into
/// out [H_kv]: LaunchFastPerturbation in fast numerics where it takes the layer (its kept run
/// over plan.kept_bound() list positions, or over n for lists the host decided; the full
/// outputs from `full_rows` when not null, PipelineBuffers::full_rows), else the fp64
/// LaunchPerturbation (exact numerics keep fp64). Errors: CudaStatus() of the launch.
absl::Status EnqueuePerturbation(const LayerPlan& plan, const DeviceLayer& layer,
                                 const int64_t* offsets, int32_t num_lists,
                                 const int32_t* indices, double* out, void* scratch,
                                 size_t scratch_bytes, cudaStream_t stream,
                                 const void* full_rows, bool host_lists = false);

/// Enqueues the scorer (LaunchScore, or LaunchModelScore with buffers.model, or with
/// plan.params.fast LaunchFastModelScore with buffers.model and buffers.fast_model) and the NaN
/// probe of buffers.scores (into buffers.first_nan): buffers.scores then holds the raw scores
/// [H_kv, n] (and buffers.critical CriticalKV's stage-2 scores, not probed: host-decided
/// layers check both on the host). Errors: CudaStatus() of the first failing launch.
absl::Status EnqueueRawScores(const LayerPlan& plan, const DeviceLayer& layer,
                              const PipelineBuffers& buffers, cudaStream_t stream);

/// EnqueueRawScores, then protection: buffers.scores holds the protected scores [H_kv, n].
absl::Status EnqueueScores(const LayerPlan& plan, const DeviceLayer& layer,
                           const PipelineBuffers& buffers, cudaStream_t stream);

/// Enqueues the whole layer on `stream`: EnqueueScores, AdaKV counts (adakv, per head),
/// selection (top-k or shared), perturbation (when planned). Per-head lists with host counts
/// (not adakv, not shared) enqueue the scorer alone and then LaunchProtectSelectTopK (NaN
/// probe, protection and top-k in one launch): buffers.scores keeps the raw scores there.
/// The meta region must hold MetaInit(plan) in stream order. Errors: CudaStatus() of the
/// first failing launch.
absl::Status EnqueueLayer(const LayerPlan& plan, const DeviceLayer& layer,
                          const PipelineBuffers& buffers, cudaStream_t stream,
                          const PipelineEvents* events = nullptr);

/// Appends to `key` everything EnqueueLayer passes to its launches for these arguments: the
/// plan's scorer, parameters, protection, sizes and selection, every field of `layer` and
/// every pointer and size of `buffers`, and the events. Equal keys: equal launch sequences
/// (launch_graph.h replays one for the other). Keep it next to EnqueueLayer's reads.
void AddEnqueueLayerKey(const LayerPlan& plan, const DeviceLayer& layer,
                        const PipelineBuffers& buffers, const PipelineEvents* events,
                        LaunchKey* key);

/// Results copied back from the device, before conversion into a LayerDecision.
struct HostResults {
  std::vector<int64_t> offsets;       // [num_lists + 1]
  std::vector<int32_t> indices;       // [total_indices]; empty when output_written
  bool output_written = false;        // the indices went to the layer's output target
  std::vector<double> perturbation;   // [H_kv] or empty
  unsigned long long first_nan = 0;   // kNoNaN when no NaN
};

/// OK when `first_nan` is kNoNaN; else INVALID_ARGUMENT worded like the CPU backend's
/// ("keys: scorer 'x' produced NaN for head h token j; ...").
absl::Status NaNStatus(const LayerPlan& plan, unsigned long long first_nan);

/// The host check of downloaded raw scores: NaNStatus of the first NaN of `scores`, then of
/// `critical` (the CPU backend's order and wording).
absl::Status HostNaNStatus(const LayerPlan& plan, const std::vector<float>& scores,
                           const std::vector<float>& critical);

/// Host-decided layers without a device decision (and benchmarks timing the host path): checks
/// the downloaded raw scores (HostNaNStatus) and decides with DecideLaProx (laprox, this layer
/// alone) or DecideLayer, exactly as CpuBackend::CompressLayer; fills every LayerDecision field
/// but perturbation and compute_seconds.
absl::Status DecideOnHost(const ResolvedPolicy& policy, const LayerPlan& plan, int32_t layer_id,
                          int32_t num_layers, const LayerBudget& budget, std::vector<float> scores,
                          std::vector<float> critical, LayerDecision* out);

/// Checks `results` (NaN -> INVALID_ARGUMENT worded like the CPU backend; inconsistent
/// offsets -> INTERNAL) and fills `out` like CpuBackend::CompressLayer (all fields but
/// compute_seconds). A block-aligned list may be shorter than total_indices (a partial last
/// block); its indices are cut to its length.
absl::Status FinishDecision(const LayerPlan& plan, int32_t layer_id, HostResults results,
                            LayerDecision* out);

}  // namespace kvtrim::gpu
