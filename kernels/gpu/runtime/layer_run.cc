#include "kernels/gpu/runtime/layer_run.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/expected_attention_stats.h"
#include "kernels/gpu/kernels/device_decide.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/kernels/device_nan_probe.h"

namespace kvtrim::gpu {

LayerRun::LayerRun(WorkerContext& context, DeviceModelCache& cache, DeviceScoreStore* store,
                   const ResolvedPolicy& policy, const ValidatedLayer& layer,
                   const LayerBudget& budget, const RunOutputs& outputs)
    : context_(context),
      cache_(cache),
      store_(store),
      policy_(policy),
      layer_(layer),
      budget_(budget),
      outputs_(outputs) {}

template <typename T>
std::vector<T> LayerRun::Pinned(size_t at, size_t count) const {
  const auto* p = reinterpret_cast<const T*>(context_.transfer().data() + at);
  return std::vector<T>(p, p + count);
}

absl::Status LayerRun::Plan() {
  const LayerShape& shape = layer_.shape;
  absl::StatusOr<LayerPlan> plan = PlanLayer(policy_, shape, layer_.keys.dtype, layer_.layer_id,
                                             layer_.num_layers, budget_);
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  const bool decide = outputs_.decision != nullptr;
  if (!decide) PlanScoresOnly(policy_, shape, &plan_);
  if (outputs_.search != nullptr) {
    if (!decide || !plan_.perturbation) {
      return absl::InternalError(
          "LayerRun: a max_perturbation search needs a decision and the perturbation statistic "
          "(values, queries, settings.perturbation on)");
    }
    PlanPerturbationSearch(&plan_);
  }
  device_decision_ = decide && plan_.decision.kind != DecisionKind::kNone;
  download_ = (!decide && outputs_.resident == nullptr) ||
              (decide && plan_.host_decide && !device_decision_);
  if (outputs_.resident != nullptr && store_ == nullptr) {
    return absl::InternalError("LayerRun: resident scores need a score store");
  }
  if (plan_.model_scorer) KVTRIM_RETURN_IF_ERROR(PlanModelInputs());
  return absl::OkStatus();
}

absl::Status LayerRun::PlanModelInputs() {
  // PolicyEngine::AttachModel refused a model scorer's policy without a model, and Validate
  // matched the layer's heads to the model's layout: a null model is a caller that skipped the
  // engine (INTERNAL, naming no request field), not a request to report.
  if (policy_.model == nullptr) {
    return absl::InternalError(absl::StrCat("scorer '", plan_.scorer_name,
                                            "' reached the GPU backend without a model"));
  }
  const RegisteredModel& model = *policy_.model;
  const LayerShape& shape = layer_.shape;
  WorkerContext& context = context_;
  auto upload = [&context](void* dst, const void* src, size_t bytes) -> absl::Status {
    KVTRIM_RETURN_IF_ERROR(context.Upload(dst, src, bytes));
    return context.Synchronize();
  };
  auto fetch = [&](ModelTensor which, const float** into) -> absl::Status {
    auto tensor = cache_.Get(policy_.model, layer_.layer_id, which, upload);
    if (!tensor.ok()) return tensor.status();
    *into = (*tensor)->data();
    held_.push_back(*std::move(tensor));
    return absl::OkStatus();
  };
  if (plan_.needs_w_o) KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kWo, &model_inputs_.w_o));
  const float* w_o16 = nullptr;  // fast numerics: the f16 image (read as bytes, not fp32)
  if (plan_.needs_w_o16) KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kWoF16, &w_o16));
  fast_inputs_.w_o16 = w_o16;
  if (plan_.needs_head_gram) {
    KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kHeadGram, &model_inputs_.head_gram));
  }
  if (plan_.needs_group_gram) {
    KVTRIM_RETURN_IF_ERROR(fetch(ModelTensor::kGroupGram, &model_inputs_.group_gram));
  }
  model_inputs_.hidden = model.layout.hidden_size;
  if (!plan_.needs_ea_stats) return absl::OkStatus();
  // The CPU scorer's own host preparation (double, rounded once): identical inputs. Device
  // queries come back to the host first (w rows: small).
  TensorView host_queries = layer_.queries;
  std::vector<uint32_t> downloaded;
  if (host_queries.present() && !host_queries.host_readable()) {
    KVTRIM_RETURN_IF_ERROR(DownloadDense(context_, layer_.queries, layer_.ready_event, &downloaded));
    host_queries.data = downloaded.data();
    host_queries.space = MemorySpace::kHost;
    host_queries.layout = nullptr;
  }
  auto stats = ComputeExpectedQueryStats(model, policy_.params, layer_.layer_id,
                                         shape.num_tokens, host_queries, layer_.softmax_scale);
  if (!stats.ok()) return stats.status();
  const int64_t d = shape.head_dim;
  const int64_t hq = model.layout.num_query_heads;
  ea_mean_.assign(static_cast<size_t>(hq * LaneMajorFloats(d)), 0.0f);
  ea_cov_.assign(static_cast<size_t>(hq * d * LaneMajorFloats(d)), 0.0f);
  ToLaneMajor(stats->mean.data(), hq, d, d, ea_mean_.data());
  ToLaneMajor(stats->cov.data(), hq * d, d, d, ea_cov_.data());
  model_inputs_.half_scale2 = stats->half_scale2;
  return absl::OkStatus();
}

absl::Status LayerRun::Stage() {
  const LayerShape& shape = layer_.shape;
  const DType dtype = layer_.keys.dtype;
  // Device working set: inputs first, then the pipeline's regions. Host inputs get arena
  // slots; dense device inputs (CUDA IPC) are read in place.
  layout_ = ArenaLayout();
  inputs_ = DeviceInputStage();
  inputs_.AddSlots(layer_, plan_.reads_keys, plan_.reads_values, plan_.reads_queries, &layout_);
  // The scratch queries read shapes only, but reject null tensors: size the regions on a
  // placeholder address (never dereferenced) before the arena's base is known.
  const DeviceLayer sizing = MakeDeviceLayer(
      plan_, shape, dtype, layer_.softmax_scale, layer_.layer_id, layer_.seed,
      inputs_.DevicePointer(0, nullptr), inputs_.DevicePointer(1, nullptr),
      inputs_.DevicePointer(2, nullptr));
  regions_ = AddPipelineRegions(plan_, sizing, &layout_);
  decision_regions_ =
      device_decision_ ? AddDecisionRegions(plan_, &layout_) : DecisionRegions{};
  // Resident LaProx candidates [H_kv, width]: the normalisation's scratch.
  width_ = shape.num_tokens - plan_.protection.sink - plan_.protection.recent;
  normalize_bytes_ = outputs_.resident != nullptr && outputs_.normalize
                         ? NormalizeCandidatesScratchBytes(shape.num_kv_heads * width_)
                         : 0;
  normalize_at_ = layout_.Add(normalize_bytes_);
  KVTRIM_RETURN_IF_ERROR(context_.arena().Reserve(layout_.total()));
  char* base = static_cast<char*>(context_.arena().data());
  device_layer_ = MakeDeviceLayer(plan_, shape, dtype, layer_.softmax_scale, layer_.layer_id,
                                  layer_.seed, inputs_.DevicePointer(0, base),
                                  inputs_.DevicePointer(1, base), inputs_.DevicePointer(2, base));
  buffers_ = ResolveBuffers(plan_, regions_, base);
  buffers_.model.w_o = model_inputs_.w_o;
  buffers_.model.head_gram = model_inputs_.head_gram;
  buffers_.model.group_gram = model_inputs_.group_gram;
  buffers_.model.hidden = model_inputs_.hidden;
  buffers_.model.half_scale2 = model_inputs_.half_scale2;
  buffers_.fast_model = fast_inputs_;
  decision_buffers_ = device_decision_ ? ResolveDecisionBuffers(plan_, decision_regions_, base)
                                       : DecisionBuffers{};

  // Pinned transfer buffer: [meta upload | offsets | indices | perturbation | first NaN |
  // scores | critical | EA statistics | decision upload | critical first NaN].
  const std::vector<int64_t> meta = MetaInit(plan_);
  const size_t lists = static_cast<size_t>(plan_.num_lists());
  const size_t heads = static_cast<size_t>(shape.num_kv_heads);
  const size_t score_bytes = heads * static_cast<size_t>(shape.num_tokens) * sizeof(float);
  const std::vector<char> upload =
      device_decision_ ? DecisionUpload(plan_, buffers_, decision_buffers_) : std::vector<char>();
  ArenaLayout host;
  pinned_.meta = host.Add(meta.size() * sizeof(int64_t));
  pinned_.offsets = host.Add((std::max(lists, heads) + 1) * sizeof(int64_t));
  pinned_.indices = host.Add(static_cast<size_t>(plan_.total_indices) * sizeof(int32_t));
  pinned_.perturbation = host.Add(heads * sizeof(double));
  pinned_.first_nan = host.Add(sizeof(unsigned long long));
  pinned_.scores = host.Add(download_ ? score_bytes : 0);
  pinned_.critical = host.Add(download_ && plan_.critical ? score_bytes : 0);
  pinned_.ea_mean = host.Add(ea_mean_.size() * sizeof(float));
  pinned_.ea_cov = host.Add(ea_cov_.size() * sizeof(float));
  pinned_.decision = host.Add(upload.size());
  pinned_.critical_nan = host.Add(sizeof(unsigned long long));
  pinned_.probes = host.Add(3 * sizeof(unsigned long long));
  pinned_.finite_flag = host.Add(sizeof(unsigned int));
  KVTRIM_RETURN_IF_ERROR(context_.transfer().Reserve(host.total()));
  char* pinned = context_.transfer().data();
  // The scorer checks the device-read K / V it reads anyway for NaN / Inf (its pass A writes
  // the pinned flag word); only the rest get a separate probe.
  const uint32_t fused = FusedFiniteInputs(plan_, device_layer_) & inputs_.device_read_inputs();
  auto* finite_flag = reinterpret_cast<unsigned int*>(pinned + pinned_.finite_flag);
  device_layer_.finite_flag = fused != 0 ? finite_flag : nullptr;

  // Inputs: host K/V/Q through the staging chunks, device ones in place or gathered (and
  // probed for NaN / Inf); the meta region, the statistics and the decision's upload.
  profiled_ = policy_.settings.profile && outputs_.decision != nullptr && !download_;
  if (profiled_) context_.stage_events().Reset();
  KVTRIM_RETURN_IF_ERROR(inputs_.Stage(
      context_, base, reinterpret_cast<unsigned long long*>(pinned + pinned_.probes),
      profiled_ ? &context_.stage_events() : nullptr, fused,
      fused != 0 ? finite_flag : nullptr));
  cudaStream_t stream = context_.stream();
  auto to_device = [&](void* dst, size_t at, const void* src, size_t bytes,
                       const char* what) -> absl::Status {
    if (bytes == 0) return absl::OkStatus();
    std::memcpy(pinned + at, src, bytes);
    return CudaStatus(cudaMemcpyAsync(dst, pinned + at, bytes, cudaMemcpyHostToDevice, stream),
                      what);
  };
  KVTRIM_RETURN_IF_ERROR(to_device(buffers_.counts, pinned_.meta, meta.data(),
                                   meta.size() * sizeof(int64_t), "cudaMemcpyAsync(meta)"));
  if (plan_.needs_ea_stats) {
    KVTRIM_RETURN_IF_ERROR(to_device(const_cast<float*>(buffers_.model.ea_mean), pinned_.ea_mean,
                                     ea_mean_.data(), ea_mean_.size() * sizeof(float),
                                     "cudaMemcpyAsync(ea_mean)"));
    KVTRIM_RETURN_IF_ERROR(to_device(const_cast<float*>(buffers_.model.ea_cov), pinned_.ea_cov,
                                     ea_cov_.data(), ea_cov_.size() * sizeof(float),
                                     "cudaMemcpyAsync(ea_cov)"));
  }
  if (device_decision_) {
    KVTRIM_RETURN_IF_ERROR(to_device(decision_buffers_.upload, pinned_.decision, upload.data(),
                                     upload.size(), "cudaMemcpyAsync(decision upload)"));
  }
  return absl::OkStatus();
}

absl::Status LayerRun::CopyBack(size_t at, const void* device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(context_.transfer().data() + at, device, bytes,
                                    cudaMemcpyDeviceToHost, context_.stream()),
                    "cudaMemcpyAsync(results)");
}

absl::Status LayerRun::Enqueue(const PipelineEvents* events, bool copy_back) {
  if (outputs_.resident != nullptr) return EnqueueResident();
  if (download_) return EnqueueDownload();
  // A profiled layer hands the pipeline the worker's stage events (the benchmark's own
  // phase events take precedence).
  PipelineEvents stage_marks;
  if (profiled_) {
    StageEvents& marks = context_.stage_events();
    KVTRIM_RETURN_IF_ERROR(marks.Record(StageEvents::kStaged, context_.stream()));
    if (events == nullptr) {
      stage_marks.after_score = marks.event(StageEvents::kScored);
      stage_marks.after_select = marks.event(StageEvents::kSelected);
      marks.MarkRecorded(StageEvents::kScored);
      marks.MarkRecorded(StageEvents::kSelected);
      events = &stage_marks;
    }
  }
  if (device_decision_ || context_.graphs().capacity() == 0) {
    KVTRIM_RETURN_IF_ERROR(EnqueueLaunches(events, copy_back));
    return copy_back ? EnqueueOutputWrite() : absl::OkStatus();
  }
  // EnqueueLayer's sequence repeats for every layer of a session whose shapes, arena regions
  // and inputs' addresses repeat: replayed as one graph (launch_graph.h).
  LaunchKey key;
  AddEnqueueLayerKey(plan_, device_layer_, buffers_, events, &key);
  key.Add(copy_back).Add(profiled_).Add(writes_output());
  if (LaunchGraphCache::Checking()) {
    key.set_label(absl::StrCat(plan_.scorer_name, " H=", plan_.num_heads, " n=",
                               plan_.num_tokens, plan_.shared ? " shared" : "",
                               plan_.adakv ? " adakv" : "", " dtype=",
                               DTypeName(device_layer_.dtype), " d=", device_layer_.head_dim,
                               " copy_back=", copy_back));
  }
  if (copy_back) {
    key.Add(context_.transfer().data()).Add(pinned_.offsets).Add(pinned_.indices);
    key.Add(pinned_.perturbation).Add(pinned_.first_nan);
  }
  KVTRIM_RETURN_IF_ERROR(context_.graphs().Run(
      context_.stream(), key, [&] { return EnqueueLaunches(events, copy_back); }));
  if (profiled_) {
    // A replayed graph records its stage events without calling EnqueueLaunches.
    context_.stage_events().MarkRecorded(StageEvents::kLaunched);
    if (copy_back) context_.stage_events().MarkRecorded(StageEvents::kCopied);
  }
  return copy_back ? EnqueueOutputWrite() : absl::OkStatus();
}

bool LayerRun::writes_output() const {
  return layer_.output.device != nullptr && outputs_.decision != nullptr && !download_;
}

absl::Status LayerRun::EnqueueOutputWrite() {
  if (!writes_output()) return absl::OkStatus();
  // The lists stay on the device: offsets then indices into the worker's region (outside
  // any launch graph: its address and event are the request's), then the worker's event.
  cudaStream_t stream = context_.stream();
  const size_t lists = static_cast<size_t>(plan_.num_lists());
  char* target = static_cast<char*>(layer_.output.device);
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(target, buffers_.offsets, (lists + 1) * sizeof(int64_t),
                      cudaMemcpyDeviceToDevice, stream),
      "cudaMemcpyAsync(output offsets)");
  if (plan_.total_indices > 0) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(target + (lists + 1) * sizeof(int64_t), buffers_.indices,
                        static_cast<size_t>(plan_.total_indices) * sizeof(int32_t),
                        cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync(output indices)");
  }
  if (layer_.output.done_event != nullptr) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(static_cast<cudaEvent_t>(layer_.output.done_event), stream),
        "cudaEventRecord(output done_event)");
  }
  return absl::OkStatus();
}

absl::Status LayerRun::EnqueueLaunches(const PipelineEvents* events, bool copy_back) {
  cudaStream_t stream = context_.stream();
  // The whole layer on the device; only the lists (and the statistic) come back.
  if (device_decision_) {
    KVTRIM_RETURN_IF_ERROR(
        EnqueueDecision(plan_, device_layer_, buffers_, decision_buffers_, stream, events));
  } else {
    KVTRIM_RETURN_IF_ERROR(EnqueueLayer(plan_, device_layer_, buffers_, stream, events));
  }
  StageEvents& marks = context_.stage_events();
  if (profiled_) KVTRIM_RETURN_IF_ERROR(marks.Record(StageEvents::kLaunched, stream));
  if (!copy_back) return absl::OkStatus();
  const size_t lists = static_cast<size_t>(plan_.num_lists());
  const size_t heads = static_cast<size_t>(layer_.shape.num_kv_heads);
  KVTRIM_RETURN_IF_ERROR(CopyBack(pinned_.offsets, buffers_.offsets, (lists + 1) * sizeof(int64_t)));
  if (!writes_output()) {  // else the indices go to the worker's region, not back here
    KVTRIM_RETURN_IF_ERROR(CopyBack(pinned_.indices, buffers_.indices,
                                    static_cast<size_t>(plan_.total_indices) * sizeof(int32_t)));
  }
  if (plan_.perturbation) {
    KVTRIM_RETURN_IF_ERROR(
        CopyBack(pinned_.perturbation, buffers_.perturbation, heads * sizeof(double)));
  }
  KVTRIM_RETURN_IF_ERROR(
      CopyBack(pinned_.first_nan, buffers_.first_nan, sizeof(unsigned long long)));
  if (device_decision_ && plan_.critical) {
    KVTRIM_RETURN_IF_ERROR(CopyBack(pinned_.critical_nan, decision_buffers_.critical_nan,
                                    sizeof(unsigned long long)));
  }
  if (profiled_) KVTRIM_RETURN_IF_ERROR(marks.Record(StageEvents::kCopied, stream));
  return absl::OkStatus();
}

absl::Status LayerRun::Fetch() {
  if (outputs_.resident != nullptr) return FetchResident();
  if (download_) return FetchDownload();
  return FetchDecision();
}

absl::Status LayerRun::FetchDecision() {
  KVTRIM_RETURN_IF_ERROR(context_.Synchronize());
  KVTRIM_RETURN_IF_ERROR(inputs_.CheckProbes(context_));  // the inputs' NaN / Inf first
  held_.clear();
  if (profiled_) KVTRIM_RETURN_IF_ERROR(context_.stage_events().Read(&device_profile_));
  if (device_decision_) {
    // The CPU backend's order: NaN in the scores, then in CriticalKV's stage-2 scores.
    const unsigned long long first_nan = Pinned<unsigned long long>(pinned_.first_nan, 1)[0];
    const unsigned long long critical_nan =
        plan_.critical ? Pinned<unsigned long long>(pinned_.critical_nan, 1)[0] : kNoNaN;
    KVTRIM_RETURN_IF_ERROR(DecisionNaNStatus(plan_, first_nan, critical_nan));
  }
  const size_t lists = static_cast<size_t>(plan_.num_lists());
  const size_t heads = static_cast<size_t>(layer_.shape.num_kv_heads);
  HostResults results;
  results.offsets = Pinned<int64_t>(pinned_.offsets, lists + 1);
  results.output_written = writes_output();
  if (!results.output_written) {
    results.indices =
        Pinned<int32_t>(pinned_.indices, static_cast<size_t>(plan_.total_indices));
  }
  if (plan_.perturbation) results.perturbation = Pinned<double>(pinned_.perturbation, heads);
  results.first_nan = Pinned<unsigned long long>(pinned_.first_nan, 1)[0];
  return FinishDecision(plan_, layer_.layer_id, std::move(results), outputs_.decision);
}

absl::Status LayerRun::EnqueueResident() {
  // ScoreLayerForModelWide: the candidates move into a buffer of their own and stay there.
  cudaStream_t stream = context_.stream();
  const int64_t heads = layer_.shape.num_kv_heads;
  const size_t n = static_cast<size_t>(layer_.shape.num_tokens);
  auto buffer = store_->Allocate(static_cast<size_t>(heads * width_), stream);
  if (!buffer.ok()) return buffer.status();
  resident_ = *std::move(buffer);
  KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(plan_, device_layer_, buffers_, stream));
  if (width_ > 0) {
    const size_t row = static_cast<size_t>(width_) * sizeof(float);
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpy2DAsync(resident_->data(), row, buffers_.scores + plan_.protection.sink,
                          n * sizeof(float), row, static_cast<size_t>(heads),
                          cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpy2DAsync(candidates)");
    if (outputs_.normalize) {
      char* base = static_cast<char*>(context_.arena().data());
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchNormalizeCandidates(resident_->data(), static_cast<int32_t>(heads), width_,
                                    width_, base + normalize_at_, normalize_bytes_, stream),
          "LaunchNormalizeCandidates");
    }
  }
  return CopyBack(pinned_.first_nan, buffers_.first_nan, sizeof(unsigned long long));
}

absl::Status LayerRun::FetchResident() {
  KVTRIM_RETURN_IF_ERROR(context_.Synchronize());
  KVTRIM_RETURN_IF_ERROR(inputs_.CheckProbes(context_));  // the inputs' NaN / Inf first
  held_.clear();
  KVTRIM_RETURN_IF_ERROR(NaNStatus(plan_, Pinned<unsigned long long>(pinned_.first_nan, 1)[0]));
  resident_->set_layout(ScoreBufferLayout{layer_.shape.num_kv_heads, layer_.shape.num_tokens,
                                          plan_.protection.sink, plan_.protection.recent,
                                          outputs_.normalize});
  LayerScores* out = outputs_.resident;
  out->resident = std::move(resident_);
  out->scores.clear();
  out->critical.clear();
  out->numerics = plan_.numerics;
  return absl::OkStatus();
}

absl::Status LayerRun::EnqueueDownload() {
  // Scores come back: ScoreLayer, or a host-decided layer without a device decision.
  cudaStream_t stream = context_.stream();
  const size_t score_bytes = static_cast<size_t>(layer_.shape.num_kv_heads) *
                             static_cast<size_t>(layer_.shape.num_tokens) * sizeof(float);
  if (outputs_.protected_scores != nullptr) {
    KVTRIM_RETURN_IF_ERROR(EnqueueScores(plan_, device_layer_, buffers_, stream));
  } else {
    KVTRIM_RETURN_IF_ERROR(EnqueueRawScores(plan_, device_layer_, buffers_, stream));
  }
  KVTRIM_RETURN_IF_ERROR(CopyBack(pinned_.scores, buffers_.scores, score_bytes));
  if (plan_.critical) {
    KVTRIM_RETURN_IF_ERROR(CopyBack(pinned_.critical, buffers_.critical, score_bytes));
  }
  return CopyBack(pinned_.first_nan, buffers_.first_nan, sizeof(unsigned long long));
}

absl::Status LayerRun::FetchDownload() {
  KVTRIM_RETURN_IF_ERROR(context_.Synchronize());
  KVTRIM_RETURN_IF_ERROR(inputs_.CheckProbes(context_));  // the inputs' NaN / Inf first
  held_.clear();
  const size_t count = static_cast<size_t>(layer_.shape.num_kv_heads) *
                       static_cast<size_t>(layer_.shape.num_tokens);
  std::vector<float> scores = Pinned<float>(pinned_.scores, count);
  std::vector<float> critical;
  if (plan_.critical) critical = Pinned<float>(pinned_.critical, count);
  if (outputs_.protected_scores != nullptr) {
    // Protection overwrote protected tokens; the probe saw the raw scores (as the CPU checks
    // them), then critical.
    KVTRIM_RETURN_IF_ERROR(NaNStatus(plan_, Pinned<unsigned long long>(pinned_.first_nan, 1)[0]));
    KVTRIM_RETURN_IF_ERROR(HostNaNStatus(plan_, {}, critical));
    *outputs_.protected_scores = std::move(scores);
    return absl::OkStatus();
  }
  if (outputs_.raw != nullptr) {
    KVTRIM_RETURN_IF_ERROR(HostNaNStatus(plan_, scores, critical));
    outputs_.raw->scores = std::move(scores);
    outputs_.raw->numerics = plan_.numerics;
    outputs_.raw->critical = std::move(critical);
    return absl::OkStatus();
  }
  if (outputs_.search != nullptr) return SearchOnHost(std::move(scores), std::move(critical));
  LayerDecision* out = outputs_.decision;
  KVTRIM_RETURN_IF_ERROR(DecideOnHost(policy_, plan_, layer_.layer_id, layer_.num_layers, budget_,
                                      std::move(scores), std::move(critical), out));
  if (!plan_.perturbation) {
    out->perturbation.clear();
    return absl::OkStatus();
  }
  return HostDecisionPerturbation(out);
}

absl::Status LayerRun::HostDecisionPerturbation(LayerDecision* out) {
  KVTRIM_RETURN_IF_ERROR(ListsPerturbation(out->offsets, out->indices, &out->perturbation));
  out->perturbation_rows = plan_.perturbation_rows;
  out->perturbation_sampled = plan_.perturbation_sampled;
  return absl::OkStatus();
}

absl::Status LayerRun::ListsPerturbation(const std::vector<int64_t>& offsets,
                                         const std::vector<int32_t>& indices,
                                         std::vector<double>* out) {
  // The host's lists go back to the device for the perturbation statistic.
  cudaStream_t stream = context_.stream();
  char* pinned = context_.transfer().data();
  const size_t heads = static_cast<size_t>(layer_.shape.num_kv_heads);
  const size_t host_lists = offsets.size() - 1;
  if (offsets.empty() || (host_lists != 1 && host_lists != heads)) {
    return absl::InternalError(
        absl::StrCat("host decision has ", host_lists, " lists for ", heads, " heads"));
  }
  if (indices.size() > static_cast<size_t>(plan_.total_indices)) {
    return absl::InternalError("host decision holds more indices than the layer has tokens");
  }
  std::memcpy(pinned + pinned_.offsets, offsets.data(), offsets.size() * sizeof(int64_t));
  std::memcpy(pinned + pinned_.indices, indices.data(), indices.size() * sizeof(int32_t));
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buffers_.offsets, pinned + pinned_.offsets,
                      offsets.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync(offsets)");
  if (!indices.empty()) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(buffers_.indices, pinned + pinned_.indices,
                        indices.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync(indices)");
  }
  KVTRIM_RETURN_IF_ERROR(EnqueuePerturbation(
      plan_, device_layer_, buffers_.offsets, static_cast<int32_t>(host_lists), buffers_.indices,
      buffers_.perturbation, buffers_.scratch, buffers_.scratch_bytes, stream,
      buffers_.full_rows, /*host_lists=*/true));
  KVTRIM_RETURN_IF_ERROR(
      CopyBack(pinned_.perturbation, buffers_.perturbation, heads * sizeof(double)));
  KVTRIM_RETURN_IF_ERROR(context_.Synchronize());
  *out = Pinned<double>(pinned_.perturbation, heads);
  return absl::OkStatus();
}

namespace {

/// A PerturbationProbe over LayerRun::ListsPerturbation (a private member, bound by the run).
class ListsProbe final : public PerturbationProbe {
 public:
  using Evaluator = std::function<absl::Status(const std::vector<int64_t>&,
                                               const std::vector<int32_t>&,
                                               std::vector<double>*)>;
  explicit ListsProbe(Evaluator evaluate) : evaluate_(std::move(evaluate)) {}
  /// The statistic of the lists on the run's staged layer, out [H_kv].
  absl::Status Evaluate(const std::vector<int64_t>& offsets, const std::vector<int32_t>& indices,
                        std::vector<double>* out) override {
    return evaluate_(offsets, indices, out);
  }

 private:
  Evaluator evaluate_;
};

}  // namespace

absl::Status LayerRun::SearchOnHost(std::vector<float> scores, std::vector<float> critical) {
  KVTRIM_RETURN_IF_ERROR(HostNaNStatus(plan_, scores, critical));
  LayerScores layer;
  layer.layer_id = layer_.layer_id;
  layer.num_layers = layer_.num_layers;
  layer.num_heads = plan_.num_heads;
  layer.num_tokens = plan_.num_tokens;
  layer.scores = std::move(scores);
  layer.critical = std::move(critical);
  layer.budget = budget_;
  layer.numerics = plan_.numerics;
  ListsProbe probe([this](const std::vector<int64_t>& offsets,
                          const std::vector<int32_t>& indices, std::vector<double>* out) {
    return ListsPerturbation(offsets, indices, out);
  });
  LayerDecision* out = outputs_.decision;
  KVTRIM_RETURN_IF_ERROR((*outputs_.search)(layer, probe, out));
  out->numerics = plan_.numerics;
  out->perturbation_rows = plan_.perturbation_rows;
  out->perturbation_sampled = plan_.perturbation_sampled;
  return absl::OkStatus();
}

}  // namespace kvtrim::gpu
