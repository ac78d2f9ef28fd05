#include "kernels/gpu/runtime/device_pipeline.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/budget.h"
#include "kernels/decide/allocate.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/stage_events.h"
#include "kernels/gpu/kernels/device_nan_probe.h"
#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/gpu/kernels/window_attention_scorer.h"
#include "kernels/layer_error.h"
#include "kernels/scorer_params.h"

namespace kvtrim::gpu {

namespace {

/// ScorerParams of a model scorer of `kind` from the resolved parameters (only the ones the
/// scorer declares; a table scorer's come from its GpuScorer::read_params), read, not
/// checked: the engine validated them with the layer (ScorerSpec::validate).
ScorerParams ReadScorerParams(ScorerKind kind, const ResolvedParams& p) {
  ScorerParams out;
  switch (kind) {
    case ScorerKind::kTable:
      break;
    case ScorerKind::kCriticalKV:
      CopyWindowPooling(p, &out);
      out.eps = static_cast<float>(p.Number("eps"));
      out.norm_l2 = p.Enum<CriticalKVNorm>("norm") == CriticalKVNorm::kL2;
      break;
    case ScorerKind::kLaProx:
      CopyWindowPooling(p, &out);
      out.gqa = p.Enum<LaProxGqa>("gqa");
      break;
    case ScorerKind::kExpectedAttention:
      out.eps = static_cast<float>(p.Number("eps"));
      out.use_vnorm = p.Bool("use_vnorm");
      break;
  }
  return out;
}

/// HasFastPath, for a scorer of `kind` whose table entry (kTable) was already looked up:
/// `table` (nullptr: none registered).
bool HasFastPathFor(ScorerKind kind, const GpuScorer* table, DType dtype, int64_t head_dim) {
  if (head_dim > 256) return false;
  const int32_t d = static_cast<int32_t>(head_dim);
  if (kind == ScorerKind::kTable) return table != nullptr && table->fast.Supports(dtype, d);
  return FastModelSupported(kind, dtype, d);
}

}  // namespace

bool HasFastPath(const ScorerSpec& scorer, DType dtype, int64_t head_dim) {
  const GpuScorer* table = scorer.kind == ScorerKind::kTable
                               ? GpuScorerTable::Builtin().Find(scorer.name)
                               : nullptr;
  return HasFastPathFor(scorer.kind, table, dtype, head_dim);
}

uint32_t FusedFiniteInputs(const LayerPlan& plan, const DeviceLayer& layer) {
  const WindowAttentionTraits* traits =
      plan.table_scorer != nullptr ? plan.table_scorer->window_attention : nullptr;
  if (!plan.params.fast || traits == nullptr || layer.dtype == DType::kF32) return 0;
  fast::FastAttentionPlan fast_plan;  // the plan LaunchScore takes
  if (fast::MakeFastAttentionPlan(*traits, layer, plan.params, &fast_plan) != cudaSuccess) {
    return 0;
  }
  return 1u | (fast_plan.with_values ? 2u : 0u);
}

absl::StatusOr<LayerPlan> PlanLayer(const ResolvedPolicy& policy, const LayerShape& shape,
                                    DType dtype, int32_t layer_id, int32_t num_layers,
                                    const LayerBudget& budget) {
  LayerPlan plan;
  plan.scorer_name = policy.scorer->name;
  plan.scorer = policy.scorer->kind;
  if (plan.scorer == ScorerKind::kTable) {
    plan.table_scorer = GpuScorerTable::Builtin().Find(plan.scorer_name);
    if (plan.table_scorer == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("scorer '", plan.scorer_name, "' has no GPU implementation"));
    }
  }
  plan.params = ReadScorerParams(plan.scorer, policy.params);
  if (plan.table_scorer != nullptr && plan.table_scorer->read_params != nullptr) {
    plan.table_scorer->read_params(policy.params, dtype, &plan.params);
  }
  if (policy.settings.numerics == Numerics::kFast &&
      HasFastPathFor(plan.scorer, plan.table_scorer, dtype, shape.head_dim)) {
    plan.numerics = Numerics::kFast;
    plan.params.fast = true;
  }
  plan.protection = budget.protection;
  plan.num_heads = static_cast<int32_t>(shape.num_kv_heads);
  plan.num_tokens = shape.num_tokens;
  const int64_t heads = shape.num_kv_heads;
  const int64_t n = shape.num_tokens;
  const int64_t k = budget.kept_per_head;

  // Model-aware scorers and host-decided layers.
  const AllocatorKind allocator = policy.allocator->kind;
  const OutputShape output = policy.settings.output_shape;
  plan.model_scorer = IsModelScorer(plan.scorer);
  plan.critical = plan.scorer == ScorerKind::kCriticalKV;
  plan.host_decide = plan.scorer == ScorerKind::kCriticalKV || plan.scorer == ScorerKind::kLaProx ||
                     allocator == AllocatorKind::kLukv || output == OutputShape::kBlockAligned ||
                     output == OutputShape::kEqualCount;
  const bool l1 = plan.scorer == ScorerKind::kCriticalKV && !plan.params.norm_l2;
  plan.needs_w_o = l1 && !plan.params.fast;
  plan.needs_w_o16 = l1 && plan.params.fast;  // the f16 image of the fast kernel
  plan.needs_head_gram = (plan.scorer == ScorerKind::kCriticalKV && plan.params.norm_l2) ||
                         (plan.scorer == ScorerKind::kLaProx && plan.params.gqa != LaProxGqa::kSummedWo);
  plan.needs_group_gram =
      plan.scorer == ScorerKind::kLaProx && plan.params.gqa == LaProxGqa::kSummedWo;
  plan.needs_ea_stats = plan.scorer == ScorerKind::kExpectedAttention;
  plan.model_query_heads = policy.model != nullptr
                               ? policy.model->layout.num_query_heads
                               : static_cast<int32_t>(shape.num_query_heads);

  // Allocation (CpuBackend::CompressLayer): tokens kept per head.
  int64_t total = 0;
  if (plan.host_decide) {
    total = 0;  // decided on the host; see the perturbation below
  } else if (allocator == AllocatorKind::kPyramid) {
    const int64_t protected_tokens = budget.protection.sink + budget.protection.recent;
    const int64_t layer_k = PyramidLayerBudget(k, n, layer_id, num_layers,
                                               policy.params.Number("beta"), protected_tokens);
    plan.counts = AllocateUniform(heads, layer_k);
    total = heads * layer_k;
  } else if (allocator == AllocatorKind::kAdaKV) {
    plan.adakv = true;
    plan.adakv_k = k;
    plan.adakv_safeguard = std::min<int64_t>(
        n, static_cast<int64_t>(std::floor(policy.params.Number("safeguard_alpha") *
                                           static_cast<double>(k))));
    // AllocateAdaKV always hands out the whole layer total H_kv * k: the safeguard
    // floor(alpha*k) <= k, and the H_kv*(k - safeguard) extra tokens fit in the
    // H_kv*(n - safeguard) candidates because k <= n.
    total = heads * k;
  } else if (allocator == AllocatorKind::kUniform) {
    plan.counts = AllocateUniform(heads, k);
    total = heads * k;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("allocator '", policy.allocator->name, "' has no GPU implementation"));
  }

  // Output shape.
  plan.shared = !plan.host_decide && output == OutputShape::kShared;
  if (plan.shared) {
    plan.adakv = false;  // only the total matters for a shared list, and it is known
    plan.counts.assign(static_cast<size_t>(heads), 0);
    plan.shared_count = std::clamp<int64_t>(
        RoundHalfUp(static_cast<double>(total) / static_cast<double>(heads)), 1, n);
    plan.total_indices = plan.shared_count;
  } else {
    if (plan.adakv || plan.host_decide) plan.counts.assign(static_cast<size_t>(heads), 0);
    plan.total_indices = total;
  }

  // Inputs read on the device (the CPU scorers read only their required inputs).
  const uint32_t inputs = policy.scorer->required_inputs;
  plan.perturbation = shape.has_values && shape.has_queries && policy.settings.perturbation;
  plan.perturbation_rows = 0;
  if (plan.perturbation) {
    const auto w = static_cast<int32_t>(shape.window_rows);
    plan.perturbation_rows = policy.settings.perturbation_sampled && plan.params.fast
                                 ? std::min(w, kSampledPerturbationRows)
                                 : w;
    plan.perturbation_sampled = plan.perturbation_rows < w;
  }
  plan.reads_keys = plan.perturbation || policy.scorer->reads_key_values;
  plan.reads_values = shape.has_values && (plan.perturbation || (inputs & kInputValues));
  plan.reads_queries = shape.has_queries && (plan.perturbation || (inputs & kInputQueries));
  // Host-decided lists are uploaded for the perturbation: room for any decision's indices.
  if (plan.host_decide && plan.perturbation) plan.total_indices = heads * n;
  plan.output_shape = output;
  // Host-decided layers are decided on the device when their counts are known here.
  if (plan.host_decide) PlanDeviceDecision(policy, shape, layer_id, num_layers, budget, &plan);
  return plan;
}

int64_t LayerPlan::kept_bound() const {
  if (host_decide || adakv) return num_tokens;
  if (shared) return shared_count;
  int64_t bound = 0;
  for (int64_t count : counts) bound = std::max(bound, count);
  return std::min(bound, num_tokens);
}

void PlanScoresOnly(const ResolvedPolicy& policy, const LayerShape& shape, LayerPlan* plan) {
  const uint32_t inputs = policy.scorer->required_inputs;
  plan->perturbation = false;
  plan->reads_keys = policy.scorer->reads_key_values;
  plan->reads_values = shape.has_values && (inputs & kInputValues);
  plan->reads_queries = shape.has_queries && (inputs & kInputQueries);
  plan->total_indices = 0;
}

void PlanPerturbationSearch(LayerPlan* plan) {
  const int64_t heads = plan->num_heads;
  plan->host_decide = true;
  plan->decision = DecisionPlan{};
  plan->adakv = plan->shared = plan->block = false;
  plan->counts.assign(static_cast<size_t>(heads), 0);
  plan->output_shape = OutputShape::kPerHead;
  plan->total_indices = heads * plan->num_tokens;
}

DeviceLayer MakeDeviceLayer(const LayerPlan& plan, const LayerShape& shape, DType dtype,
                            float softmax_scale, int32_t layer_id, uint64_t seed,
                            const void* keys, const void* values, const void* queries) {
  DeviceLayer layer;
  layer.keys = keys;
  layer.values = plan.reads_values ? values : nullptr;
  layer.queries = plan.reads_queries ? queries : nullptr;
  layer.dtype = dtype;
  layer.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
  layer.num_query_heads = plan.reads_queries ? static_cast<int32_t>(shape.num_query_heads) : 0;
  layer.window_rows = plan.reads_queries ? static_cast<int32_t>(shape.window_rows) : 0;
  layer.head_dim = static_cast<int32_t>(shape.head_dim);
  layer.num_tokens = shape.num_tokens;
  layer.softmax_scale = softmax_scale;
  layer.layer_id = layer_id;
  layer.seed = seed;
  return layer;
}

namespace {

/// True when EnqueueLayer selects with LaunchProtectSelectTopK: per-head lists with host
/// counts (uniform, pyramid). AdaKV and shared lists read the protected buffers.scores.
bool FusedSelection(const LayerPlan& plan) {
  return !plan.shared && !plan.adakv && !plan.host_decide;
}

/// Scratch bytes the selection of `plan` takes from the pipeline's scratch region: only the
/// launchers this plan runs (EnqueueLayer, or EnqueueLayerDecision for host_decide layers),
/// so a per-head plan on the fused kernel reserves none of the shared lists' sort storage.
size_t SelectionScratchBytes(const LayerPlan& plan) {
  const int32_t heads = plan.num_heads;
  const int64_t n = plan.num_tokens;
  size_t bytes = ProtectSelectTopKScratchBytes(heads, n);
  if (plan.host_decide) {
    // kLaProx and kNone select from the decision's own region or on the host.
    if (plan.decision.kind != DecisionKind::kLayer) return bytes;
    if (plan.decision.adakv) bytes = std::max(bytes, SelectTopKScratchBytes(heads, n));
    if (plan.decision.shape == OutputShape::kShared) {
      bytes = std::max(bytes, SelectSharedScratchBytes(heads, n));
    }
    return bytes;
  }
  if (plan.shared) return std::max(bytes, SelectSharedScratchBytes(heads, n));
  if (plan.adakv) return std::max(bytes, SelectTopKScratchBytes(heads, n));
  return bytes;
}

}  // namespace

PipelineRegions AddPipelineRegions(const LayerPlan& plan, const DeviceLayer& layer,
                                   ArenaLayout* layout) {
  PipelineRegions r;
  const size_t heads = static_cast<size_t>(plan.num_heads);
  const size_t n = static_cast<size_t>(plan.num_tokens);
  size_t score_scratch = 0;
  if (plan.model_scorer) {
    // Sizing reads shapes only: placeholder model inputs (never dereferenced).
    static const float kPlaceholder = 0;
    DeviceModelInputs sizing;
    sizing.w_o = sizing.head_gram = sizing.group_gram = &kPlaceholder;
    sizing.ea_mean = sizing.ea_cov = &kPlaceholder;
    sizing.hidden = 1;
    sizing.num_query_heads = plan.model_query_heads;
    if (plan.params.fast) {
      FastModelInputs fast_sizing;
      fast_sizing.w_o16 = &kPlaceholder;
      score_scratch =
          FastModelScoreScratchBytes(plan.scorer, layer, plan.params, sizing, fast_sizing);
    } else {
      score_scratch = ModelScoreScratchBytes(plan.scorer, layer, plan.params, sizing);
    }
  } else if (plan.table_scorer != nullptr) {
    score_scratch = plan.table_scorer->For(plan.params.fast).ScratchBytes(layer, plan.params);
  }
  r.scratch_bytes = std::max(score_scratch, SelectionScratchBytes(plan));
  if (plan.perturbation) r.scratch_bytes = std::max(r.scratch_bytes, PerturbationBytes(plan, layer));
  if (plan.perturbation && plan.params.fast && plan.table_scorer != nullptr &&
      plan.table_scorer->window_attention != nullptr) {
    r.full_rows_bytes = FastScorerRowsBytes(*plan.table_scorer->window_attention, layer,
                                            plan.params, plan.perturbation_rows,
                                            &r.full_rows_from);
  }
  r.scores = layout->Add(heads * n * sizeof(float));
  // Meta: counts, offsets, then the first-NaN slot (uploaded with them, see MetaInit).
  const size_t meta_values = heads + static_cast<size_t>(plan.num_lists()) + 1;
  r.meta = layout->Add((meta_values + 1) * sizeof(int64_t));
  r.first_nan = r.meta + meta_values * sizeof(int64_t);
  r.indices = layout->Add(static_cast<size_t>(std::max<int64_t>(plan.total_indices, 1)) *
                          sizeof(int32_t));
  r.perturbation = layout->Add(heads * sizeof(double));
  r.critical = layout->Add(plan.critical ? heads * n * sizeof(float) : 0);
  const size_t vf = static_cast<size_t>(LaneMajorFloats(layer.head_dim));
  const size_t hq = static_cast<size_t>(std::max(plan.model_query_heads, 0));
  r.ea_mean = layout->Add(plan.needs_ea_stats ? hq * vf * sizeof(float) : 0);
  r.ea_cov = layout->Add(plan.needs_ea_stats
                             ? hq * static_cast<size_t>(layer.head_dim) * vf * sizeof(float)
                             : 0);
  r.full_rows = layout->Add(r.full_rows_bytes);
  r.scratch = layout->Add(r.scratch_bytes);
  return r;
}

PipelineBuffers ResolveBuffers(const LayerPlan& plan, const PipelineRegions& regions, void* base) {
  char* b = static_cast<char*>(base);
  PipelineBuffers out;
  out.scores = reinterpret_cast<float*>(b + regions.scores);
  out.counts = reinterpret_cast<int64_t*>(b + regions.meta);
  out.offsets = out.counts + plan.num_heads;
  out.indices = reinterpret_cast<int32_t*>(b + regions.indices);
  out.perturbation = reinterpret_cast<double*>(b + regions.perturbation);
  out.first_nan = reinterpret_cast<unsigned long long*>(b + regions.first_nan);
  out.critical = plan.critical ? reinterpret_cast<float*>(b + regions.critical) : nullptr;
  out.scratch = regions.scratch_bytes ? b + regions.scratch : nullptr;
  out.scratch_bytes = regions.scratch_bytes;
  if (regions.full_rows_bytes > 0 && out.scratch != nullptr) {
    out.full_rows = b + regions.full_rows;
    out.full_rows_bytes = regions.full_rows_bytes;
    out.full_rows_from = b + regions.scratch + regions.full_rows_from;
  }
  if (plan.needs_ea_stats) {
    out.model.ea_mean = reinterpret_cast<const float*>(b + regions.ea_mean);
    out.model.ea_cov = reinterpret_cast<const float*>(b + regions.ea_cov);
  }
  out.model.num_query_heads = plan.model_query_heads;
  return out;
}

std::vector<int64_t> MetaInit(const LayerPlan& plan) {
  std::vector<int64_t> meta(plan.counts);
  meta.resize(static_cast<size_t>(plan.num_heads), 0);
  meta.resize(meta.size() + static_cast<size_t>(plan.num_lists()) + 1, 0);
  if (plan.shared) meta.back() = plan.shared_count;
  meta.push_back(static_cast<int64_t>(kNoNaN));  // the first-NaN slot: all bits set
  return meta;
}

namespace {

/// Enqueues the scorer alone (its table entry's launch, or LaunchModelScore /
/// LaunchFastModelScore with buffers.model and buffers.fast_model): raw scores [H_kv, n] in
/// buffers.scores (and CriticalKV's stage-2 scores in buffers.critical).
absl::Status EnqueueScorer(const LayerPlan& plan, const DeviceLayer& layer,
                           const PipelineBuffers& b, cudaStream_t stream) {
  if (plan.model_scorer && plan.params.fast) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchFastModelScore(plan.scorer, layer, plan.params, b.model, b.fast_model, b.scores,
                             b.critical, b.scratch, b.scratch_bytes, stream),
        absl::StrCat("LaunchFastModelScore(", plan.scorer_name, ")"));
  } else if (plan.model_scorer) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchModelScore(plan.scorer, layer, plan.params, b.model, b.scores, b.critical,
                         b.scratch, b.scratch_bytes, stream),
        absl::StrCat("LaunchModelScore(", plan.scorer_name, ")"));
  } else {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        plan.table_scorer->For(plan.params.fast)
            .launch(layer, plan.params, b.scores, b.scratch, b.scratch_bytes, stream),
        absl::StrCat("LaunchScore(", plan.scorer_name, ")"));
  }
  if (b.full_rows != nullptr && plan.num_tokens > 0) {
    // The scorer's row outputs, before the selection reuses its scratch: the perturbation
    // statistic's full outputs.
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.full_rows, b.full_rows_from, b.full_rows_bytes,
                                                cudaMemcpyDeviceToDevice, stream),
                                "cudaMemcpyAsync(full rows)");
  }
  return absl::OkStatus();
}


}  // namespace

absl::Status EnqueueRawScores(const LayerPlan& plan, const DeviceLayer& layer,
                              const PipelineBuffers& b, cudaStream_t stream) {
  KVTRIM_RETURN_IF_ERROR(EnqueueScorer(plan, layer, b, stream));
  KVTRIM_CUDA_RETURN_IF_ERROR(
      LaunchFindFirstNaN(b.scores, static_cast<int64_t>(plan.num_heads) * plan.num_tokens,
                         b.first_nan, stream),
      "LaunchFindFirstNaN");
  return absl::OkStatus();
}

absl::Status EnqueueScores(const LayerPlan& plan, const DeviceLayer& layer,
                           const PipelineBuffers& b, cudaStream_t stream) {
  const int32_t heads = plan.num_heads;
  const int64_t n = plan.num_tokens;
  KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(plan, layer, b, stream));
  KVTRIM_CUDA_RETURN_IF_ERROR(LaunchApplyProtection(b.scores, heads, n, plan.protection.sink,
                                                    plan.protection.recent, stream),
                              "LaunchApplyProtection");
  return absl::OkStatus();
}

absl::Status EnqueueLayer(const LayerPlan& plan, const DeviceLayer& layer,
                          const PipelineBuffers& b, cudaStream_t stream,
                          const PipelineEvents* events) {
  const int32_t heads = plan.num_heads;
  const int64_t n = plan.num_tokens;
  const bool fused = FusedSelection(plan);
  if (fused) {
    KVTRIM_RETURN_IF_ERROR(EnqueueScorer(plan, layer, b, stream));
  } else {
    KVTRIM_RETURN_IF_ERROR(EnqueueScores(plan, layer, b, stream));
  }
  KVTRIM_RETURN_IF_ERROR(
      RecordStreamEvent(events != nullptr ? events->after_score : nullptr, stream));
  if (fused) {
    // NaN probe, protection and top-k in one launch; b.first_nan holds kNoNaN (MetaInit).
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchProtectSelectTopK(b.scores, heads, n, plan.protection.sink, plan.protection.recent,
                                b.counts, b.offsets, b.indices, b.first_nan, b.scratch,
                                b.scratch_bytes, stream),
        "LaunchProtectSelectTopK");
  } else if (plan.shared) {
    KVTRIM_CUDA_RETURN_IF_ERROR(LaunchSelectShared(b.scores, heads, n, plan.shared_count,
                                                   b.indices, b.scratch, b.scratch_bytes, stream),
                                "LaunchSelectShared");
  } else {
    if (plan.adakv) {
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchAdaKVCounts(b.scores, heads, n, plan.adakv_k, plan.adakv_safeguard, b.counts,
                            b.scratch, b.scratch_bytes, stream),
          "LaunchAdaKVCounts");
    }
    KVTRIM_CUDA_RETURN_IF_ERROR(LaunchSelectTopK(b.scores, heads, n, b.counts, b.offsets,
                                                 b.indices, b.scratch, b.scratch_bytes, stream),
                                "LaunchSelectTopK");
  }
  KVTRIM_RETURN_IF_ERROR(
      RecordStreamEvent(events != nullptr ? events->after_select : nullptr, stream));
  if (plan.perturbation) {
    KVTRIM_RETURN_IF_ERROR(EnqueuePerturbation(plan, layer, b.offsets, plan.num_lists(),
                                               b.indices, b.perturbation, b.scratch,
                                               b.scratch_bytes, stream, b.full_rows));
  }
  return absl::OkStatus();
}

size_t PerturbationBytes(const LayerPlan& plan, const DeviceLayer& layer) {
  const size_t fast =
      plan.params.fast ? FastPerturbationScratchBytes(layer, plan.perturbation_rows) : 0;
  return fast > 0 ? fast : PerturbationScratchBytes(layer);
}

absl::Status EnqueuePerturbation(const LayerPlan& plan, const DeviceLayer& layer,
                                 const int64_t* offsets, int32_t num_lists,
                                 const int32_t* indices, double* out, void* scratch,
                                 size_t scratch_bytes, cudaStream_t stream,
                                 const void* full_rows, bool host_lists) {
  if (plan.params.fast) {
    // Layers the fast kernels do not take are refused before anything is launched.
    FastPerturbationHints hints;
    hints.kept_bound = host_lists ? plan.num_tokens : plan.kept_bound();
    hints.full_rows = plan.num_tokens > 0 ? full_rows : nullptr;
    const cudaError_t fast = LaunchFastPerturbation(layer, plan.perturbation_rows, offsets,
                                                    num_lists, indices, out, scratch,
                                                    scratch_bytes, stream, hints);
    if (fast != cudaErrorNotSupported) {
      KVTRIM_CUDA_RETURN_IF_ERROR(fast, "LaunchFastPerturbation");
      return absl::OkStatus();
    }
  }
  KVTRIM_CUDA_RETURN_IF_ERROR(LaunchPerturbation(layer, offsets, num_lists, indices, out, scratch,
                                                 scratch_bytes, stream),
                              "LaunchPerturbation");
  return absl::OkStatus();
}

// A field added to one of these structs must join the key below (then update the size).
static_assert(sizeof(ScorerParams) == 64, "new ScorerParams field: add it to the launch key");
static_assert(sizeof(DeviceLayer) == 80, "new DeviceLayer field: add it to the launch key");
static_assert(sizeof(PipelineBuffers) == 160, "new PipelineBuffers field: add it to the key");
static_assert(sizeof(DeviceModelInputs) == 56, "new DeviceModelInputs field: add it to the key");
static_assert(sizeof(FastModelInputs) == 8, "new FastModelInputs field: add it to the key");
static_assert(sizeof(PipelineEvents) == 16, "new PipelineEvents field: add it to the key");

void AddEnqueueLayerKey(const LayerPlan& plan, const DeviceLayer& layer,
                        const PipelineBuffers& buffers, const PipelineEvents* events,
                        LaunchKey* key) {
  // The plan: which launches, and their by-value arguments.
  key->Add(plan.scorer).Add(plan.table_scorer).Add(plan.model_scorer).Add(plan.host_decide);
  key->Add(plan.critical);
  const ScorerParams& p = plan.params;
  key->Add(p.window).Add(p.kernel).Add(p.pool_max).Add(p.eps).Add(p.bf16_prob_round);
  key->Add(p.causal_normalize).Add(p.norm_l2).Add(p.gqa);
  key->Add(p.use_vnorm).Add(p.fast);
  for (uint64_t word : p.table.words()) key->Add(word);
  key->Add(plan.protection.sink).Add(plan.protection.recent);
  key->Add(plan.num_heads).Add(plan.num_tokens);
  key->Add(plan.adakv).Add(plan.adakv_k).Add(plan.adakv_safeguard);
  key->Add(plan.shared).Add(plan.shared_count).Add(plan.block).Add(plan.total_indices);
  key->Add(plan.perturbation).Add(plan.perturbation_rows);
  // The layer, every field.
  key->Add(layer.keys).Add(layer.values).Add(layer.queries).Add(layer.dtype);
  key->Add(layer.num_kv_heads).Add(layer.num_query_heads).Add(layer.window_rows);
  key->Add(layer.head_dim).Add(layer.num_tokens).Add(layer.softmax_scale).Add(layer.layer_id);
  key->Add(layer.seed).Add(layer.finite_flag);
  // The buffers, every pointer and size, the model inputs included.
  const PipelineBuffers& b = buffers;
  key->Add(b.scores).Add(b.counts).Add(b.offsets).Add(b.indices).Add(b.perturbation);
  key->Add(b.first_nan).Add(b.critical).Add(b.scratch).Add(b.scratch_bytes);
  key->Add(b.full_rows).Add(b.full_rows_bytes).Add(b.full_rows_from);
  key->Add(b.model.w_o).Add(b.model.head_gram).Add(b.model.group_gram).Add(b.model.ea_mean);
  key->Add(b.model.ea_cov).Add(b.model.hidden).Add(b.model.num_query_heads);
  key->Add(b.model.half_scale2).Add(b.fast_model.w_o16);
  key->Add(events != nullptr ? events->after_score : nullptr);
  key->Add(events != nullptr ? events->after_select : nullptr);
}

absl::Status NaNStatus(const LayerPlan& plan, unsigned long long first_nan) {
  if (first_nan == kNoNaN) return absl::OkStatus();
  const int64_t n = plan.num_tokens;
  const int64_t i = static_cast<int64_t>(first_nan);
  return LayerFieldError(
      "keys", absl::StrCat("scorer '", plan.scorer_name, "' produced NaN for head ", i / n,
                           " token ", i % n, "; the input magnitudes overflow fp32 arithmetic"));
}

absl::Status HostNaNStatus(const LayerPlan& plan, const std::vector<float>& scores,
                           const std::vector<float>& critical) {
  for (const std::vector<float>* values : {&scores, &critical}) {
    for (size_t i = 0; i < values->size(); ++i) {
      if (std::isnan((*values)[i])) return NaNStatus(plan, static_cast<unsigned long long>(i));
    }
  }
  return absl::OkStatus();
}

absl::Status DecideOnHost(const ResolvedPolicy& policy, const LayerPlan& plan, int32_t layer_id,
                          int32_t num_layers, const LayerBudget& budget, std::vector<float> scores,
                          std::vector<float> critical, LayerDecision* out) {
  KVTRIM_RETURN_IF_ERROR(HostNaNStatus(plan, scores, critical));
  LayerScores layer;
  layer.layer_id = layer_id;
  layer.num_layers = num_layers;
  layer.num_heads = plan.num_heads;
  layer.num_tokens = plan.num_tokens;
  layer.scores = std::move(scores);
  layer.critical = std::move(critical);
  layer.budget = budget;
  if (plan.scorer == ScorerKind::kLaProx) {
    // One layer alone (CpuBackend::CompressLayer): local / layer modes decide here.
    std::vector<LayerScores> layers;
    layers.push_back(std::move(layer));
    auto decisions = DecideLaProx(policy, layers);
    if (!decisions.ok()) return decisions.status();
    *out = std::move((*decisions)[0]);
    out->numerics = plan.numerics;
    return absl::OkStatus();
  }
  KVTRIM_RETURN_IF_ERROR(DecideLayer(policy, layer, out));
  out->numerics = plan.numerics;
  return absl::OkStatus();
}

absl::Status FinishDecision(const LayerPlan& plan, int32_t layer_id, HostResults results,
                            LayerDecision* out) {
  const int64_t heads = plan.num_heads;
  const int64_t n = plan.num_tokens;
  KVTRIM_RETURN_IF_ERROR(NaNStatus(plan, results.first_nan));
  const std::vector<int64_t>& offsets = results.offsets;
  // A block-aligned list ends early when its last block is partial.
  bool consistent = offsets.size() == static_cast<size_t>(plan.num_lists()) + 1 &&
                    offsets.front() == 0 &&
                    (plan.block ? offsets.back() <= plan.total_indices
                                : offsets.back() == plan.total_indices);
  for (size_t i = 1; consistent && i < offsets.size(); ++i) {
    consistent = offsets[i] >= offsets[i - 1] && offsets[i] - offsets[i - 1] <= n;
  }
  if (!consistent) {
    return absl::InternalError(absl::StrCat(
        "GPU selection returned inconsistent offsets for scorer '", plan.scorer_name,
        "' (expected ", plan.total_indices, " indices in ", plan.num_lists(), " lists)"));
  }
  out->layer_id = layer_id;
  out->num_tokens = n;
  out->output_shape = plan.output_shape;
  out->offsets = offsets;
  out->indices = std::move(results.indices);
  out->output_written = results.output_written;
  if (!out->output_written) out->indices.resize(static_cast<size_t>(offsets.back()));
  out->kept_per_head.assign(static_cast<size_t>(heads), 0);
  for (int64_t h = 0; h < heads; ++h) {
    const size_t list = plan.num_lists() == 1 ? 0 : static_cast<size_t>(h);
    out->kept_per_head[static_cast<size_t>(h)] =
        static_cast<int32_t>(offsets[list + 1] - offsets[list]);
  }
  out->perturbation = plan.perturbation ? std::move(results.perturbation) : std::vector<double>();
  out->perturbation_rows = plan.perturbation ? plan.perturbation_rows : 0;
  out->perturbation_sampled = plan.perturbation && plan.perturbation_sampled;
  out->numerics = plan.numerics;
  return absl::OkStatus();
}

}  // namespace kvtrim::gpu
