#include "kernels/gpu/runtime/device_decision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/budget.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/kernels/device_nan_probe.h"
#include "kernels/gpu/runtime/device_pipeline.h"
#include "kernels/gpu/runtime/device_pool.h"
#include "kernels/gpu/runtime/device_score_buffer.h"
#include "kernels/gpu/runtime/stage_events.h"

namespace kvtrim::gpu {

namespace {

size_t Aligned(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}


/// The candidate tables of a kLaProx layer whose raw scores [H_kv, n] start at `scores`
/// (null: for sizes only).
CandidateTables LayerTables(const LayerPlan& plan, const float* scores) {
  CandidateSource source;
  source.sink = plan.protection.sink;
  source.recent = plan.protection.recent;
  source.values = scores != nullptr ? scores + source.sink : nullptr;
  source.pitch = plan.num_tokens;
  source.num_heads = plan.num_heads;
  source.width = plan.num_tokens - source.sink - source.recent;
  source.keep = plan.decision.laprox_keep;
  return BuildCandidateTables({source}, plan.decision.laprox.scope);
}

/// DecideLayer on the device, from the raw scores (and critical scores) in `b`.
absl::Status EnqueueLayerDecision(const LayerPlan& plan, const PipelineBuffers& b,
                                  const DecisionBuffers& d, cudaStream_t stream) {
  const DecisionPlan& p = plan.decision;
  const int32_t heads = plan.num_heads;
  const int64_t n = plan.num_tokens;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d.spare_nan, 0xFF, sizeof(unsigned long long), stream),
                              "cudaMemsetAsync(spare NaN slot)");
  // Protection: uniform, or per head on lukv's counts (rule 3 per head).
  KVTRIM_CUDA_RETURN_IF_ERROR(
      LaunchProtectHeads(b.scores, heads, n, d.sink, d.recent, p.max_protected, stream),
      "LaunchProtectHeads");
  if (p.adakv) {
    KVTRIM_CUDA_RETURN_IF_ERROR(LaunchAdaKVCounts(b.scores, heads, n, p.adakv_k, p.adakv_safeguard,
                                                  b.counts, b.scratch, b.scratch_bytes, stream),
                                "LaunchAdaKVCounts");
  }
  // CriticalKV: stage 1 = the top (protected + round(alpha * b)) by attention; the ranking is
  // the stage-2 score, protected, with the stage-1 tokens forced to +inf.
  float* ranked = b.scores;
  if (p.critical) {
    KVTRIM_CUDA_RETURN_IF_ERROR(LaunchStageOneCounts(b.counts, d.sink, d.recent, heads, n, p.alpha,
                                                     d.stage1_counts, stream),
                                "LaunchStageOneCounts");
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchProtectSelectTopK(b.scores, heads, n, 0, 0, d.stage1_counts, d.stage1_offsets,
                                d.stage1_indices, d.spare_nan, b.scratch, b.scratch_bytes, stream),
        "LaunchProtectSelectTopK(stage 1)");
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchProtectHeads(b.critical, heads, n, d.sink, d.recent, p.max_protected, stream),
        "LaunchProtectHeads(critical)");
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchForceKeep(b.critical, heads, n, d.stage1_offsets, d.stage1_indices, n, stream),
        "LaunchForceKeep");
    ranked = b.critical;
  }
  switch (p.shape) {
    case OutputShape::kShared:
      KVTRIM_CUDA_RETURN_IF_ERROR(LaunchSelectShared(ranked, heads, n, plan.shared_count,
                                                     b.indices, b.scratch, b.scratch_bytes, stream),
                                  "LaunchSelectShared");
      break;
    case OutputShape::kBlockAligned:
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchBlockMax(ranked, heads, n, p.block_size, d.block_scores, stream), "LaunchBlockMax");
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchSelectShared(d.block_scores, heads, p.num_blocks, p.wanted_blocks, d.chosen,
                             d.scratch, d.scratch_bytes, stream),
          "LaunchSelectShared(blocks)");
      KVTRIM_CUDA_RETURN_IF_ERROR(LaunchExpandBlocks(d.chosen, p.wanted_blocks, p.block_size, n,
                                                     b.indices, b.offsets, stream),
                                  "LaunchExpandBlocks");
      break;
    default:  // per head, equal count
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchProtectSelectTopK(ranked, heads, n, 0, 0, b.counts, b.offsets, b.indices,
                                  d.spare_nan, b.scratch, b.scratch_bytes, stream),
          "LaunchProtectSelectTopK");
      break;
  }
  return absl::OkStatus();
}

/// DecideLaProx over this layer alone, from the raw scores in `b` (normalised in place).
absl::Status EnqueueLaProxLayer(const LayerPlan& plan, const PipelineBuffers& b,
                                const DecisionBuffers& d, cudaStream_t stream) {
  const int64_t sink = plan.protection.sink;
  const int64_t width = plan.num_tokens - sink - plan.protection.recent;
  if (plan.decision.laprox.normalize) {
    KVTRIM_CUDA_RETURN_IF_ERROR(LaunchNormalizeCandidates(b.scores + sink, plan.num_heads, width,
                                                          plan.num_tokens, d.scratch,
                                                          d.scratch_bytes, stream),
                                "LaunchNormalizeCandidates");
  }
  const CandidateTables tables = LayerTables(plan, b.scores);
  return EnqueueSelectCandidates(tables, PlaceCandidateTables(tables, d.upload), b.offsets,
                                 b.indices, d.scratch, d.scratch_bytes, stream);
}

}  // namespace

// ---- Per-layer decisions ----------------------------------------------------------------------

void PlanDeviceDecision(const ResolvedPolicy& policy, const LayerShape& shape, int32_t layer_id,
                        int32_t num_layers, const LayerBudget& budget, LayerPlan* plan) {
  const int64_t heads = shape.num_kv_heads;
  const int64_t n = shape.num_tokens;
  const int64_t k = budget.kept_per_head;
  const OutputShape output = policy.settings.output_shape;
  DecisionPlan d;
  d.shape = output;
  if (plan->scorer == ScorerKind::kLaProx) {
    absl::StatusOr<LaProxPlan> laprox = PlanLaProx(policy);
    if (!laprox.ok()) return;  // DecideOnHost reports it after the NaN check
    d.kind = DecisionKind::kLaProx;
    d.laprox = *laprox;
    d.sink.assign(static_cast<size_t>(heads), budget.protection.sink);
    d.recent.assign(static_cast<size_t>(heads), budget.protection.recent);
    d.laprox_keep = k - budget.protection.sink - budget.protection.recent;
    plan->counts.assign(static_cast<size_t>(heads), 0);
    plan->adakv = plan->shared = plan->block = false;
    plan->total_indices = heads * k;  // H_kv * (sink + recent) protected + H_kv * keep
    plan->decision = std::move(d);
    return;
  }
  // Counts (AllocateCounts): EQUAL_COUNT and uniform k, pyramid and lukv on the host; AdaKV on
  // the device from the protected scores.
  const AllocatorKind allocator = policy.allocator->kind;
  const bool equal = output == OutputShape::kEqualCount;
  const bool lukv = allocator == AllocatorKind::kLukv && !equal;
  d.adakv = allocator == AllocatorKind::kAdaKV && !equal;
  std::vector<int64_t> counts(static_cast<size_t>(heads), 0);
  int64_t total = 0;  // the counts' sum (DecideLayer's shared / block total)
  if (d.adakv) {
    d.adakv_k = k;
    d.adakv_safeguard = std::min<int64_t>(
        n, static_cast<int64_t>(std::floor(policy.params.Number("safeguard_alpha") *
                                           static_cast<double>(k))));
    total = heads * k;  // AllocateAdaKV hands out the whole layer total (see PlanLayer)
  } else {
    LayerScores layer;  // AllocateCounts reads no scores for these allocators
    layer.layer_id = layer_id;
    layer.num_layers = num_layers;
    layer.num_heads = heads;
    layer.num_tokens = n;
    layer.budget = budget;
    absl::StatusOr<std::vector<int64_t>> allocated = AllocateCounts(policy, layer, {});
    if (!allocated.ok() || allocated->size() != counts.size()) return;
    counts = *std::move(allocated);
    total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  }
  // Protection per head, and the lists' sizes.
  int64_t kept = 0;    // indices of per-head lists (counts clamped to [0, n])
  int64_t stage1 = 0;  // room for the stage-1 lists
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t count = std::clamp<int64_t>(counts[static_cast<size_t>(h)], 0, n);
    const Protection p = lukv ? ClampProtection(budget.requested, count, n) : budget.protection;
    d.sink.push_back(p.sink);
    d.recent.push_back(p.recent);
    d.max_protected = std::max({d.max_protected, p.sink, p.recent});
    kept += count;
    stage1 += std::min(n, std::max(count, p.sink + p.recent));
  }
  if (d.adakv) {
    kept = heads * k;
    stage1 = std::min(heads * n, heads * k + std::accumulate(d.sink.begin(), d.sink.end(), int64_t{0}) +
                                     std::accumulate(d.recent.begin(), d.recent.end(), int64_t{0}));
  }
  d.kind = DecisionKind::kLayer;
  d.critical = plan->critical;
  d.alpha = d.critical ? policy.params.Number("alpha") : 0.0;
  d.stage1_capacity = d.critical ? stage1 : 0;
  plan->adakv = plan->shared = plan->block = false;
  const double mean = static_cast<double>(total) / static_cast<double>(heads);
  if (output == OutputShape::kShared) {
    plan->shared = true;
    plan->shared_count = std::clamp<int64_t>(RoundHalfUp(mean), 1, n);
    plan->total_indices = plan->shared_count;
  } else if (output == OutputShape::kBlockAligned) {
    d.block_size = policy.settings.block_size;
    d.num_blocks = (n + d.block_size - 1) / d.block_size;
    d.wanted_blocks = std::clamp<int64_t>(
        RoundHalfUp(mean / static_cast<double>(d.block_size)), 1, d.num_blocks);
    plan->block = true;
    plan->total_indices = std::min(n, d.wanted_blocks * d.block_size);
  } else {
    plan->total_indices = kept;
  }
  plan->counts = d.adakv ? std::vector<int64_t>(static_cast<size_t>(heads), 0) : std::move(counts);
  plan->decision = std::move(d);
}

DecisionRegions AddDecisionRegions(const LayerPlan& plan, ArenaLayout* layout) {
  DecisionRegions r;
  const DecisionPlan& d = plan.decision;
  const size_t heads = static_cast<size_t>(plan.num_heads);
  size_t scratch = 0;
  if (d.kind == DecisionKind::kLaProx) {
    const CandidateTables tables = LayerTables(plan, nullptr);
    r.upload_bytes = tables.bytes();
    scratch = SelectCandidatesScratchBytes(static_cast<int32_t>(tables.heads.size()),
                                           static_cast<int32_t>(tables.tiles.size()),
                                           static_cast<int32_t>(tables.segments.size()));
    if (d.laprox.normalize) {
      const int64_t width = plan.num_tokens - plan.protection.sink - plan.protection.recent;
      scratch = std::max(scratch, NormalizeCandidatesScratchBytes(plan.num_heads * width));
    }
  } else {
    r.upload_bytes = 2 * heads * sizeof(int64_t);
  }
  r.upload = layout->Add(r.upload_bytes);
  r.stage1_counts = layout->Add(d.critical ? heads * sizeof(int64_t) : 0);
  r.stage1_offsets = layout->Add(d.critical ? (heads + 1) * sizeof(int64_t) : 0);
  r.stage1_indices =
      layout->Add(d.critical ? static_cast<size_t>(std::max<int64_t>(d.stage1_capacity, 1)) * sizeof(int32_t)
                             : 0);
  r.slots = layout->Add(2 * sizeof(unsigned long long));
  r.block_scores = layout->Add(plan.block ? heads * static_cast<size_t>(d.num_blocks) * sizeof(float) : 0);
  r.chosen = layout->Add(plan.block ? static_cast<size_t>(d.wanted_blocks) * sizeof(int32_t) : 0);
  if (plan.block) scratch = std::max(scratch, SelectScratchBytes(plan.num_heads, d.num_blocks));
  r.scratch_bytes = scratch;
  r.scratch = layout->Add(scratch);
  return r;
}

DecisionBuffers ResolveDecisionBuffers(const LayerPlan& plan, const DecisionRegions& regions,
                                       void* base) {
  char* b = static_cast<char*>(base);
  DecisionBuffers out;
  out.upload = b + regions.upload;
  out.upload_bytes = regions.upload_bytes;
  if (plan.decision.kind == DecisionKind::kLayer) {
    out.sink = reinterpret_cast<int64_t*>(out.upload);
    out.recent = out.sink + plan.num_heads;
  }
  if (plan.decision.critical) {
    out.stage1_counts = reinterpret_cast<int64_t*>(b + regions.stage1_counts);
    out.stage1_offsets = reinterpret_cast<int64_t*>(b + regions.stage1_offsets);
    out.stage1_indices = reinterpret_cast<int32_t*>(b + regions.stage1_indices);
  }
  out.critical_nan = reinterpret_cast<unsigned long long*>(b + regions.slots);
  out.spare_nan = out.critical_nan + 1;
  if (plan.block) {
    out.block_scores = reinterpret_cast<float*>(b + regions.block_scores);
    out.chosen = reinterpret_cast<int32_t*>(b + regions.chosen);
  }
  out.scratch = regions.scratch_bytes ? b + regions.scratch : nullptr;
  out.scratch_bytes = regions.scratch_bytes;
  return out;
}

std::vector<char> DecisionUpload(const LayerPlan& plan, const PipelineBuffers& buffers,
                                 const DecisionBuffers& decision) {
  std::vector<char> out(decision.upload_bytes);
  const DecisionPlan& d = plan.decision;
  if (d.kind == DecisionKind::kLaProx) {
    WriteCandidateTables(LayerTables(plan, buffers.scores), out.data(), decision.upload);
  } else if (d.kind == DecisionKind::kLayer) {
    const size_t bytes = d.sink.size() * sizeof(int64_t);
    std::memcpy(out.data(), d.sink.data(), bytes);
    std::memcpy(out.data() + bytes, d.recent.data(), bytes);
  }
  return out;
}

absl::Status EnqueueDecision(const LayerPlan& plan, const DeviceLayer& layer,
                             const PipelineBuffers& buffers, const DecisionBuffers& decision,
                             cudaStream_t stream, const PipelineEvents* events) {
  if (plan.decision.kind == DecisionKind::kNone) {
    return absl::InternalError("EnqueueDecision: the layer has no device decision");
  }
  KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(plan, layer, buffers, stream));
  if (plan.critical) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        LaunchFindFirstNaN(buffers.critical, static_cast<int64_t>(plan.num_heads) * plan.num_tokens,
                           decision.critical_nan, stream),
        "LaunchFindFirstNaN(critical)");
  }
  KVTRIM_RETURN_IF_ERROR(
      RecordStreamEvent(events != nullptr ? events->after_score : nullptr, stream));
  if (plan.decision.kind == DecisionKind::kLaProx) {
    KVTRIM_RETURN_IF_ERROR(EnqueueLaProxLayer(plan, buffers, decision, stream));
  } else {
    KVTRIM_RETURN_IF_ERROR(EnqueueLayerDecision(plan, buffers, decision, stream));
  }
  KVTRIM_RETURN_IF_ERROR(
      RecordStreamEvent(events != nullptr ? events->after_select : nullptr, stream));
  if (plan.perturbation) {
    KVTRIM_RETURN_IF_ERROR(EnqueuePerturbation(plan, layer, buffers.offsets, plan.num_lists(),
                                               buffers.indices, buffers.perturbation,
                                               buffers.scratch, buffers.scratch_bytes, stream,
                                               buffers.full_rows));
  }
  return absl::OkStatus();
}

absl::Status DecisionNaNStatus(const LayerPlan& plan, unsigned long long first_nan,
                               unsigned long long critical_nan) {
  KVTRIM_RETURN_IF_ERROR(NaNStatus(plan, first_nan));
  if (plan.critical) KVTRIM_RETURN_IF_ERROR(NaNStatus(plan, critical_nan));
  return absl::OkStatus();
}

// ---- LaProx candidate tables ------------------------------------------------------------------

size_t CandidateTables::bytes() const {
  return Aligned(heads.size() * sizeof(CandidateHead)) +
         Aligned(tiles.size() * sizeof(CandidateTile)) +
         Aligned(segments.size() * sizeof(CandidateSegment));
}

CandidateTables BuildCandidateTables(const std::vector<CandidateSource>& sources,
                                     LaProxScope scope) {
  CandidateTables t;
  int64_t model_keep = 0;        // kModel: the sum of the layers' budgets
  int64_t model_candidates = 0;  // and of their candidates
  if (scope == LaProxScope::kModel) t.segments.push_back(CandidateSegment{});
  for (const CandidateSource& s : sources) {
    const int64_t width = std::max<int64_t>(s.width, 0);
    const int64_t keep = std::max<int64_t>(s.keep, 0);
    if (scope == LaProxScope::kLayer) {
      CandidateSegment layer;
      layer.keep = std::min(s.num_heads * keep, s.num_heads * width);
      layer.first_tile = static_cast<int32_t>(t.tiles.size());
      t.segments.push_back(layer);
    }
    for (int64_t h = 0; h < s.num_heads; ++h) {
      if (scope == LaProxScope::kHead) {
        CandidateSegment head;
        head.keep = std::min(keep, width);
        head.first_tile = static_cast<int32_t>(t.tiles.size());
        t.segments.push_back(head);
      }
      CandidateHead head;
      head.values = s.values != nullptr ? s.values + h * s.pitch : nullptr;
      head.width = width;
      head.sink = s.sink;
      head.recent = s.recent;
      head.protected_before = t.protected_total;
      head.segment = static_cast<int32_t>(t.segments.size()) - 1;
      head.first_tile = static_cast<int32_t>(t.tiles.size());
      const int32_t index = static_cast<int32_t>(t.heads.size());
      for (int64_t begin = 0; begin < width; begin += kCandidateTile) {
        CandidateTile tile;
        tile.head = index;
        tile.begin = begin;
        t.tiles.push_back(tile);
      }
      t.heads.push_back(head);
      t.protected_total += s.sink + s.recent;
    }
    model_keep += s.num_heads * keep;
    model_candidates += s.num_heads * width;
  }
  if (scope == LaProxScope::kModel) t.segments[0].keep = std::min(model_keep, model_candidates);
  for (const CandidateSegment& segment : t.segments) t.kept_total += segment.keep;
  return t;
}

CandidateTablePointers PlaceCandidateTables(const CandidateTables& tables, char* device) {
  CandidateTablePointers p;
  const size_t heads = Aligned(tables.heads.size() * sizeof(CandidateHead));
  const size_t tiles = Aligned(tables.tiles.size() * sizeof(CandidateTile));
  p.heads = reinterpret_cast<const CandidateHead*>(device);
  p.tiles = reinterpret_cast<const CandidateTile*>(device + heads);
  p.segments = reinterpret_cast<const CandidateSegment*>(device + heads + tiles);
  return p;
}

CandidateTablePointers WriteCandidateTables(const CandidateTables& tables, char* out,
                                            char* device) {
  const size_t heads = Aligned(tables.heads.size() * sizeof(CandidateHead));
  const size_t tiles = Aligned(tables.tiles.size() * sizeof(CandidateTile));
  std::memset(out, 0, tables.bytes());
  std::memcpy(out, tables.heads.data(), tables.heads.size() * sizeof(CandidateHead));
  std::memcpy(out + heads, tables.tiles.data(), tables.tiles.size() * sizeof(CandidateTile));
  std::memcpy(out + heads + tiles, tables.segments.data(),
              tables.segments.size() * sizeof(CandidateSegment));
  return PlaceCandidateTables(tables, device);
}

absl::Status EnqueueSelectCandidates(const CandidateTables& tables,
                                     const CandidateTablePointers& device, int64_t* head_start,
                                     int32_t* indices, void* scratch, size_t scratch_bytes,
                                     cudaStream_t stream) {
  KVTRIM_CUDA_RETURN_IF_ERROR(
      LaunchSelectCandidates(device.heads, static_cast<int32_t>(tables.heads.size()), device.tiles,
                             static_cast<int32_t>(tables.tiles.size()), device.segments,
                             static_cast<int32_t>(tables.segments.size()), tables.protected_total,
                             head_start, indices, scratch, scratch_bytes, stream),
      "LaunchSelectCandidates");
  return absl::OkStatus();
}

// ---- Model-wide decision ---------------------------------------------------------------------

namespace {

/// One layer of a model-wide decision: where its candidates lie on the device.
struct StagedLayer {
  const float* resident = nullptr;  // a DeviceScoreBuffer's [H_kv, width], or null
  size_t upload = 0;                // else: the arena region of its host scores [H_kv, n]
  int64_t width = 0;
};

/// Checks `layer` (index `l`) and says where its candidates are.
absl::Status StageLayer(const LayerScores& layer, size_t l, const DeviceScoreStore& store,
                        const LaProxPlan& laprox, StagedLayer* out) {
  const Protection& p = layer.budget.protection;
  out->width = layer.num_tokens - p.sink - p.recent;
  if (layer.num_heads < 0 || layer.num_heads > 65535 || out->width < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers[", l, "]: H_kv=", layer.num_heads, ", n=", layer.num_tokens, ", sink=", p.sink,
        ", recent=", p.recent, " is not a layer"));
  }
  if (layer.resident == nullptr) {
    const size_t want = static_cast<size_t>(layer.num_heads * layer.num_tokens);
    if (layer.scores.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("layers[", l, "]: scores hold ",
                                                     layer.scores.size(), " values, not H_kv * n = ",
                                                     want));
    }
    return absl::OkStatus();
  }
  const auto* buffer = dynamic_cast<const DeviceScoreBuffer*>(layer.resident.get());
  if (buffer == nullptr || buffer->store() != &store) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layers[", l, "]: the layer's scores are held by another backend"));
  }
  const ScoreBufferLayout& kept = buffer->layout();
  if (kept.num_heads != layer.num_heads || kept.num_tokens != layer.num_tokens ||
      kept.sink != p.sink || kept.recent != p.recent) {
    return absl::InternalError(absl::StrCat("layers[", l, "]: the scores kept on the GPU do not "
                                            "match the layer's shape and protection"));
  }
  if (kept.normalized != laprox.normalize) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layers[", l, "]: the layer was scored for another laprox mode (normalised: ",
        kept.normalized ? "yes" : "no", ")"));
  }
  out->resident = buffer->data();
  return absl::OkStatus();
}

}  // namespace

absl::Status DecideModelWideOnDevice(WorkerContext& context, const DeviceScoreStore& store,
                                     const ResolvedPolicy& policy,
                                     const std::vector<LayerScores>& layers,
                                     std::vector<LayerDecision>* out) {
  absl::StatusOr<LaProxPlan> laprox = PlanLaProx(policy);
  if (!laprox.ok()) return laprox.status();
  out->clear();
  if (layers.empty()) return absl::OkStatus();
  cudaStream_t stream = context.stream();

  // Where each layer's candidates are; host scores get arena regions [H_kv, n].
  std::vector<StagedLayer> staged(layers.size());
  ArenaLayout layout;
  size_t scratch_bytes = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    KVTRIM_RETURN_IF_ERROR(StageLayer(layers[l], l, store, *laprox, &staged[l]));
    if (staged[l].resident != nullptr) continue;
    staged[l].upload = layout.Add(layers[l].scores.size() * sizeof(float));
    if (laprox->normalize) {
      scratch_bytes = std::max(scratch_bytes,
                               NormalizeCandidatesScratchBytes(layers[l].num_heads * staged[l].width));
    }
  }
  // The tables' shape does not depend on where the candidates are: size with null pointers.
  auto sources = [&](const char* base) {
    std::vector<CandidateSource> list(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerScores& layer = layers[l];
      CandidateSource& s = list[l];
      s.sink = layer.budget.protection.sink;
      s.recent = layer.budget.protection.recent;
      s.num_heads = layer.num_heads;
      s.width = staged[l].width;
      s.keep = layer.budget.kept_per_head - s.sink - s.recent;
      if (staged[l].resident != nullptr) {
        s.values = staged[l].resident;
        s.pitch = s.width;
      } else {
        s.values = base != nullptr
                       ? reinterpret_cast<const float*>(base + staged[l].upload) + s.sink
                       : nullptr;
        s.pitch = layer.num_tokens;
      }
    }
    return list;
  };
  const CandidateTables sizing = BuildCandidateTables(sources(nullptr), laprox->scope);
  const size_t num_heads = sizing.heads.size();
  if (num_heads > static_cast<size_t>(INT32_MAX) - 1 || sizing.tiles.size() > INT32_MAX ||
      sizing.total() > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model-wide decision spans ", num_heads, " heads and ", sizing.total(),
        " kept tokens, more than one device decision takes"));
  }
  scratch_bytes = std::max(
      scratch_bytes, SelectCandidatesScratchBytes(static_cast<int32_t>(num_heads),
                                                  static_cast<int32_t>(sizing.tiles.size()),
                                                  static_cast<int32_t>(sizing.segments.size())));
  const size_t scratch_at = layout.Add(scratch_bytes);
  const size_t tables_at = layout.Add(sizing.bytes());
  const size_t starts_at = layout.Add((num_heads + 1) * sizeof(int64_t));
  const size_t indices_at =
      layout.Add(static_cast<size_t>(std::max<int64_t>(sizing.total(), 1)) * sizeof(int32_t));
  KVTRIM_RETURN_IF_ERROR(context.arena().Reserve(layout.total()));
  char* base = static_cast<char*>(context.arena().data());
  const CandidateTables tables = BuildCandidateTables(sources(base), laprox->scope);

  // Pinned: [tables | head starts | indices].
  ArenaLayout host;
  const size_t host_tables = host.Add(tables.bytes());
  const size_t host_starts = host.Add((num_heads + 1) * sizeof(int64_t));
  const size_t host_indices = host.Add(static_cast<size_t>(tables.total()) * sizeof(int32_t));
  KVTRIM_RETURN_IF_ERROR(context.transfer().Reserve(host.total()));
  char* pinned = context.transfer().data();

  // Host-scored layers (a CPU-computed layer, e.g. d above the GPU kernels' limit) go up and
  // are normalised as the resident ones were when scored.
  for (size_t l = 0; l < layers.size(); ++l) {
    if (staged[l].resident != nullptr) continue;
    const LayerScores& layer = layers[l];
    float* dst = reinterpret_cast<float*>(base + staged[l].upload);
    KVTRIM_RETURN_IF_ERROR(
        context.Upload(dst, layer.scores.data(), layer.scores.size() * sizeof(float)));
    if (laprox->normalize) {
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchNormalizeCandidates(dst + layer.budget.protection.sink,
                                    static_cast<int32_t>(layer.num_heads), staged[l].width,
                                    layer.num_tokens, base + scratch_at, scratch_bytes, stream),
          "LaunchNormalizeCandidates");
    }
  }
  const CandidateTablePointers device =
      WriteCandidateTables(tables, pinned + host_tables, base + tables_at);
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + tables_at, pinned + host_tables,
                                              tables.bytes(), cudaMemcpyHostToDevice, stream),
                              "cudaMemcpyAsync(candidate tables)");
  auto* starts = reinterpret_cast<int64_t*>(base + starts_at);
  auto* indices = reinterpret_cast<int32_t*>(base + indices_at);
  KVTRIM_RETURN_IF_ERROR(EnqueueSelectCandidates(tables, device, starts, indices,
                                                 base + scratch_at, scratch_bytes, stream));
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(pinned + host_starts, starts, (num_heads + 1) * sizeof(int64_t),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(head starts)");
  if (tables.total() > 0) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(pinned + host_indices, indices,
                        static_cast<size_t>(tables.total()) * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(kept indices)");
  }
  KVTRIM_RETURN_IF_ERROR(context.Synchronize());

  // Decisions: layer l's heads are the next H_kv of the table.
  const auto* start = reinterpret_cast<const int64_t*>(pinned + host_starts);
  const auto* kept = reinterpret_cast<const int32_t*>(pinned + host_indices);
  bool consistent = start[0] == 0 && start[num_heads] == tables.total();
  for (size_t g = 0; consistent && g < num_heads; ++g) consistent = start[g + 1] >= start[g];
  if (!consistent) {
    return absl::InternalError(absl::StrCat(
        "the model-wide GPU selection returned inconsistent lists (expected ", tables.total(),
        " indices over ", num_heads, " heads)"));
  }
  out->resize(layers.size());
  std::vector<size_t> first_head(layers.size() + 1, 0);
  for (size_t l = 0; l < layers.size(); ++l) {
    first_head[l + 1] = first_head[l] + static_cast<size_t>(layers[l].num_heads);
  }
  auto fill = [&](size_t l) {
    const LayerScores& layer = layers[l];
    const size_t g = first_head[l];
    LayerDecision& d = (*out)[l];
    d.layer_id = layer.layer_id;
    d.num_tokens = layer.num_tokens;
    d.output_shape = policy.settings.output_shape;
    d.numerics = layer.numerics;
    d.offsets.resize(static_cast<size_t>(layer.num_heads) + 1);
    d.kept_per_head.resize(static_cast<size_t>(layer.num_heads));
    for (size_t h = 0; h < d.offsets.size(); ++h) d.offsets[h] = start[g + h] - start[g];
    for (size_t h = 0; h < d.kept_per_head.size(); ++h) {
      d.kept_per_head[h] = static_cast<int32_t>(d.offsets[h + 1] - d.offsets[h]);
    }
    d.indices.assign(kept + start[g], kept + start[first_head[l + 1]]);
    d.perturbation.clear();
    d.compute_seconds = 0;
  };
  // Millions of indices: first-touch page faults and copies cost milliseconds on one core,
  // so large answers are built by a few threads (one per 1M indices), each taking every
  // threads-th layer. (One per 256K was no faster on a 16-core H100 host: 0.6-1.1 ms
  // instead of 0.5-0.9 ms for 3.4M indices.)
  constexpr int64_t kIndicesPerThread = int64_t{1} << 20;
  const size_t threads = static_cast<size_t>(std::clamp<int64_t>(
      std::min<int64_t>(tables.total() / kIndicesPerThread,
                        static_cast<int64_t>(std::thread::hardware_concurrency())),
      1, std::min<int64_t>(8, static_cast<int64_t>(layers.size()))));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) {
    helpers.emplace_back([&, t] {
      for (size_t l = t; l < layers.size(); l += threads) fill(l);
    });
  }
  for (size_t l = 0; l < layers.size(); l += threads) fill(l);
  for (std::thread& helper : helpers) helper.join();
  return absl::OkStatus();
}

}  // namespace kvtrim::gpu
