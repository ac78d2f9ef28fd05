#include "service/response_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kvtrim/v1/packed_lists.h"

namespace kvtrim::service {

namespace {

void EncodeInputs(uint32_t bits, google::protobuf::RepeatedField<int>* out) {
  if (bits & kInputKeys) out->Add(v1::POLICY_INPUT_KEYS);
  if (bits & kInputValues) out->Add(v1::POLICY_INPUT_VALUES);
  if (bits & kInputQueries) out->Add(v1::POLICY_INPUT_QUERIES);
  if (bits & kInputModel) out->Add(v1::POLICY_INPUT_MODEL);
  if (bits & kInputProfile) out->Add(v1::POLICY_INPUT_PROFILE);
}

v1::DecisionScope EncodeScope(DecisionScope scope) {
  switch (scope) {
    case DecisionScope::kHead: return v1::DECISION_SCOPE_HEAD;
    case DecisionScope::kLayer: return v1::DECISION_SCOPE_LAYER;
    case DecisionScope::kModel: return v1::DECISION_SCOPE_MODEL;
  }
  return v1::DECISION_SCOPE_UNSPECIFIED;
}

v1::ParamSpec::Kind EncodeKind(ParamSpec::Kind kind) {
  switch (kind) {
    case ParamSpec::Kind::kInt: return v1::ParamSpec::KIND_INT;
    case ParamSpec::Kind::kFloat: return v1::ParamSpec::KIND_FLOAT;
    case ParamSpec::Kind::kBool: return v1::ParamSpec::KIND_BOOL;
    case ParamSpec::Kind::kEnum: return v1::ParamSpec::KIND_ENUM;
  }
  return v1::ParamSpec::KIND_UNSPECIFIED;
}

v1::OutputShape EncodeOutputShape(OutputShape shape) {
  switch (shape) {
    case OutputShape::kPerHead: return v1::PER_HEAD;
    case OutputShape::kShared: return v1::SHARED;
    case OutputShape::kBlockAligned: return v1::BLOCK_ALIGNED;
    case OutputShape::kEqualCount: return v1::EQUAL_COUNT;
  }
  return v1::OUTPUT_SHAPE_UNSPECIFIED;
}

void EncodePolicy(const std::string& name, const std::string& description,
                  const ScorerSpec& scorer, const AllocatorSpec& allocator,
                  const std::string& selector, const Backend& backend, v1::PolicyInfo* out) {
  out->set_name(name);
  out->set_description(description);
  out->set_paper(allocator.kind == AllocatorKind::kUniform
                     ? scorer.paper
                     : absl::StrCat(scorer.paper, "; ", allocator.paper));
  out->set_scorer(scorer.name);
  out->set_allocator(allocator.name);
  out->set_selector(selector);
  const uint32_t required = scorer.required_inputs | allocator.required_inputs;
  EncodeInputs(required, out->mutable_inputs());
  EncodeInputs(scorer.optional_inputs & ~required, out->mutable_optional_inputs());
  for (const ParamSpec& p : PolicyRegistry::CombinedParams(scorer, allocator)) {
    v1::ParamSpec* spec = out->add_params();
    spec->set_name(p.name);
    spec->set_kind(EncodeKind(p.kind));
    spec->set_description(p.description);
    spec->set_default_number(p.default_number);
    spec->set_default_text(p.default_text);
    spec->set_min(p.min);
    spec->set_max(p.max);
    for (const auto& c : p.choices) spec->add_choices(c);
  }
  out->set_scope(EncodeScope(std::max(scorer.scope, allocator.scope)));
  out->set_default_sink_tokens(scorer.doc_default_sink);
  out->set_default_recent_tokens(scorer.doc_default_recent);
  const std::vector<Numerics> modes = backend.NumericsModes(scorer, allocator);
  for (Numerics mode : {Numerics::kFast, Numerics::kExact}) {
    if (std::find(modes.begin(), modes.end(), mode) != modes.end()) {
      out->add_numerics_modes(EncodeNumerics(mode));
    }
  }
  for (OutputShape shape : PolicyRegistry::OutputShapes(scorer, allocator)) {
    out->add_output_shapes(EncodeOutputShape(shape));
  }
}

}  // namespace

v1::Numerics EncodeNumerics(Numerics mode) {
  return mode == Numerics::kFast ? v1::NUMERICS_FAST : v1::NUMERICS_EXACT;
}

void EncodeLayerResult(const LayerDecision& decision, v1::LayerResult* out, bool packed) {
  out->set_layer_id(decision.layer_id);
  out->set_num_tokens(decision.num_tokens);
  out->set_output_shape(EncodeOutputShape(decision.output_shape));
  if (decision.output_written) {
    out->set_output_written(true);  // the lists are in the layer's output region
  } else if (packed) {
    v1::PackedLists* lists = out->mutable_packed();
    const uint32_t width = v1::PackedIndexBytes(decision.num_tokens);
    v1::PackOffsets(decision.offsets.data(), decision.offsets.size(), lists->mutable_offsets());
    v1::PackIndices(decision.indices.data(), decision.indices.size(), width,
                    lists->mutable_indices());
    lists->set_index_bytes(width);
  } else {
    out->mutable_offsets()->Add(decision.offsets.begin(), decision.offsets.end());
    out->mutable_indices()->Add(decision.indices.begin(), decision.indices.end());
  }
  const bool has_perturbation = decision.perturbation.size() == decision.kept_per_head.size();
  for (size_t h = 0; h < decision.kept_per_head.size(); ++h) {
    v1::HeadStats* head = out->add_heads();
    head->set_kept(decision.kept_per_head[h]);
    if (has_perturbation) head->set_perturbation(decision.perturbation[h]);
  }
  out->set_compute_seconds(decision.compute_seconds);
  out->set_perturbation_rows(has_perturbation ? decision.perturbation_rows : 0);
  out->set_numerics(EncodeNumerics(decision.numerics));
}

void EncodeLayerProfile(const LayerProfile& p, v1::LayerProfile* out) {
  out->set_server_seconds(p.server);
  out->set_decode_seconds(p.decode);
  out->set_validate_seconds(p.validate);
  out->set_queued_seconds(p.queued);
  out->set_worker_wait_seconds(p.worker_wait);
  out->set_plan_seconds(p.plan);
  out->set_stage_seconds(p.stage);
  out->set_ready_wait_seconds(p.ready_wait);
  out->set_stage_device_seconds(p.stage_device);
  out->set_score_seconds(p.score);
  out->set_select_seconds(p.select);
  out->set_perturbation_seconds(p.perturbation);
  out->set_download_seconds(p.download);
  out->set_fetch_seconds(p.fetch);
  out->set_encode_seconds(p.encode);
}

void EncodePolicies(const PolicyRegistry& registry, const Backend& backend,
                    v1::ListPoliciesResponse* out) {
  for (const PolicyPreset& preset : registry.presets()) {
    const ScorerSpec* scorer = registry.FindScorer(preset.scorer);
    const AllocatorSpec* allocator = registry.FindAllocator(preset.allocator);
    if (scorer == nullptr || allocator == nullptr ||
        !PolicyRegistry::CheckComposable(*scorer, *allocator).ok()) {
      continue;
    }
    EncodePolicy(preset.name, preset.description, *scorer, *allocator, preset.selector, backend,
                 out->add_policies());
  }
  const auto scorers = registry.scorers();
  const auto allocators = registry.allocators();
  for (const ScorerSpec* scorer : scorers) {
    out->add_scorers(scorer->name);
    for (const AllocatorSpec* allocator : allocators) {
      if (!PolicyRegistry::CheckComposable(*scorer, *allocator).ok()) continue;
      EncodePolicy(absl::StrCat(scorer->name, "+", allocator->name),
                   absl::StrCat(scorer->name, " scores with the ", allocator->name,
                                " allocator: ", allocator->description),
                   *scorer, *allocator, "topk", backend, out->add_policies());
    }
  }
  for (const AllocatorSpec* allocator : allocators) out->add_allocators(allocator->name);
}

}  // namespace kvtrim::service
