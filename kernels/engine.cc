#include "kernels/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "kernels/finite_scan.h"
#include "kernels/decide/perturbation_budget.h"
#include "kernels/layer_error.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

namespace {

std::string ShapeString(const TensorView& t) {
  return absl::StrCat("[", t.shape[0], ", ", t.shape[1], ", ", t.shape[2], "]");
}

}  // namespace

PolicyEngine::PolicyEngine(const PolicyRegistry& registry, Backend& backend, EngineLimits limits)
    : registry_(registry), backend_(backend), limits_(limits) {}

absl::StatusOr<ResolvedPolicy> PolicyEngine::Prepare(const CompressionSettings& settings,
                                                     const std::string& field_prefix) const {
  const Budget& b = settings.budget;
  if (b.by_perturbation) {
    KVTRIM_RETURN_IF_ERROR(CheckPerturbationBudgetNumbers(b, field_prefix));
  } else if (b.by_fraction) {
    if (!(b.keep_fraction > 0.0 && b.keep_fraction <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_prefix, ".budget.keep_fraction: must be in (0, 1], got ",
                       ExactNumber(b.keep_fraction)));
    }
  } else if (b.keep_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field_prefix, ".budget.keep_tokens: must be >= 1, got ", b.keep_tokens));
  }
  if (settings.sink_tokens && *settings.sink_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field_prefix, ".sink_tokens: must be >= 0, got ",
                                                   *settings.sink_tokens));
  }
  if (settings.recent_tokens && *settings.recent_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field_prefix, ".recent_tokens: must be >= 0, got ", *settings.recent_tokens));
  }
  if (settings.num_layers < 0 || settings.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(field_prefix, ".num_layers: must be in [0, ",
                                                   kMaxLayers, "] (0 = unknown), got ",
                                                   settings.num_layers));
  }
  if (settings.output_shape == OutputShape::kBlockAligned && settings.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field_prefix, ".block_size: BLOCK_ALIGNED needs block_size >= 1, got ",
        settings.block_size));
  }
  absl::StatusOr<ResolvedPolicy> resolved = registry_.Resolve(settings, field_prefix);
  if (!resolved.ok()) return resolved.status();
  KVTRIM_RETURN_IF_ERROR(CheckPerturbationBudget(*resolved, field_prefix));
  return resolved;
}

absl::Status PolicyEngine::AttachModel(ResolvedPolicy* policy,
                                       std::shared_ptr<const RegisteredModel> model,
                                       const std::string& field) const {
  policy->model = std::move(model);
  const ScorerSpec& scorer = *policy->scorer;
  const AllocatorSpec& allocator = *policy->allocator;
  const uint32_t needs = scorer.required_inputs | allocator.required_inputs;
  if ((needs & kInputModel) != 0 && policy->model == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".model_digest: policy '", policy->name,
        "' needs a registered model (RegisterModel: W_O, RoPE, optional query statistics and "
        "LU-KV profiles); set model_digest to the digest RegisterModel returned"));
  }
  // Which scorer + allocator pairs and output shapes compose is the registry's rule
  // (PolicyRegistry::CheckComposable / OutputShapes), already applied by Resolve.
  if (scorer.kind == ScorerKind::kExpectedAttention &&
      policy->params.Enum<QueryStatsSource>("query_stats") == QueryStatsSource::kModel &&
      policy->model != nullptr && !policy->model->has_query_stats()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ".model_digest: expected_attention with query_stats=model needs query "
               "statistics, and model ", policy->model->digest, " was registered without them"));
  }
  if (allocator.kind == AllocatorKind::kLukv) {
    const LukvProfile* profile = policy->model->FindProfile(scorer.name);
    if (profile == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".model_digest: lukv over scorer '", scorer.name, "' needs profile.",
          scorer.name, " registered with the model (kvtrim-lukv-profile builds it); model ",
          policy->model->digest, " has none"));
    }
    if (profile->metric != scorer.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".policy.name: profile.", scorer.name, " was built for metric '",
          profile->metric, "', not '", scorer.name, "'"));
    }
    Protection requested = scorer.default_protection(policy->params, 0);
    if (policy->settings.sink_tokens) requested.sink = *policy->settings.sink_tokens;
    if (policy->settings.recent_tokens) requested.recent = *policy->settings.recent_tokens;
    if (requested.sink != profile->sink || requested.recent != profile->window) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".sink_tokens/recent_tokens: profile.", scorer.name, " was built with sink=",
          profile->sink, " window=", profile->window, " but this request protects sink=",
          requested.sink, " recent=", requested.recent,
          "; rebuild the profile or match its protection"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLayerId(int64_t layer_id, const std::string& field) {
  if (layer_id < 0 || layer_id >= kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".layer_id: must be in [0, ",
                                                   kMaxLayers - 1, "], got ", layer_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<ValidatedLayer> PolicyEngine::Validate(const ResolvedPolicy& policy,
                                                      const LayerRequest& layer,
                                                      const std::string& field) const {
  const ScorerSpec& scorer = *policy.scorer;
  ValidatedLayer v;
  KVTRIM_RETURN_IF_ERROR(CheckLayerId(layer.layer_id, field));
  if (policy.settings.num_layers > 0 && layer.layer_id >= policy.settings.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".layer_id: ", layer.layer_id,
                                                   " is not below num_layers=",
                                                   policy.settings.num_layers));
  }
  // Keys.
  const TensorView& k = layer.keys;
  if (!k.present()) return absl::InvalidArgumentError(absl::StrCat(field, ".keys: is required"));
  if (k.shape[0] < 1 || k.shape[0] > limits_.max_heads) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".keys.shape[0]: H_kv must be in [1, ",
                                                   limits_.max_heads, "], got ", k.shape[0]));
  }
  if (k.shape[1] < 1 || k.shape[1] > limits_.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".keys.shape[1]: n must be in [1, ",
                                                   limits_.max_tokens, "], got ", k.shape[1]));
  }
  if (k.shape[2] < 1 || k.shape[2] > limits_.max_head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".keys.shape[2]: d must be in [1, ",
                                                   limits_.max_head_dim, "], got ", k.shape[2]));
  }
  v.shape.num_kv_heads = k.shape[0];
  v.shape.num_tokens = k.shape[1];
  v.shape.head_dim = k.shape[2];
  // Values.
  if (layer.values.present()) {
    if (layer.values.shape != k.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".values.shape: ", ShapeString(layer.values), " does not match keys ",
          ShapeString(k), " ([H_kv, n, d])"));
    }
    if (layer.values.dtype != k.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".values.dtype: ",
                                                     DTypeName(layer.values.dtype),
                                                     " differs from keys ", DTypeName(k.dtype)));
    }
    v.shape.has_values = true;
  }
  // Queries.
  if (layer.queries.present()) {
    const TensorView& q = layer.queries;
    if (q.dtype != k.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".queries.dtype: ", DTypeName(q.dtype), " differs from keys ", DTypeName(k.dtype)));
    }
    if (q.shape[0] < 1 || q.shape[0] > limits_.max_heads || q.shape[0] % k.shape[0] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".queries.shape[0]: H_q=", q.shape[0], " is not a positive multiple of H_kv=",
          k.shape[0], " (at most ", limits_.max_heads, ")"));
    }
    if (q.shape[1] < 1 || q.shape[1] > k.shape[1] || q.shape[1] > limits_.max_window_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".queries.shape[1]: w=", q.shape[1], " must be in [1, min(n=", k.shape[1],
          ", ", limits_.max_window_rows, ")]"));
    }
    if (q.shape[2] != k.shape[2]) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".queries.shape[2]: d=", q.shape[2],
                                                     " does not match keys d=", k.shape[2]));
    }
    v.shape.num_query_heads = q.shape[0];
    v.shape.window_rows = q.shape[1];
    v.shape.has_queries = true;
  }
  // Inputs the policy needs.
  if ((scorer.required_inputs & kInputValues) && !v.shape.has_values) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".values: policy '", policy.name,
                                                   "' needs values [H_kv, n, d]"));
  }
  if ((scorer.required_inputs & kInputQueries) && !v.shape.has_queries) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".queries: policy '", policy.name,
                                                   "' needs window queries [H_q, w, d]"));
  }
  // An error-targeted budget evaluates the perturbation statistic, which reads both.
  if (policy.settings.budget.by_perturbation) {
    if (!v.shape.has_values) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".values: a max_perturbation budget needs values [H_kv, n, d] (the "
                 "perturbation statistic reads them)"));
    }
    if (!v.shape.has_queries) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".queries: a max_perturbation budget needs window queries [H_q, w, d] (the "
                 "perturbation statistic reads them)"));
    }
  }
  // The registered model's head layout, for policies that read it.
  const uint32_t needs = scorer.required_inputs | policy.allocator->required_inputs;
  if (policy.model != nullptr && (needs & kInputModel) != 0) {
    const ModelLayout& m = policy.model->layout;
    if (layer.layer_id >= m.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".layer_id: ", layer.layer_id,
                                                     " is not below the model's num_layers=",
                                                     m.num_layers));
    }
    if (v.shape.num_kv_heads != m.num_kv_heads || v.shape.head_dim != m.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".keys.shape: [H_kv=", v.shape.num_kv_heads, ", n, d=", v.shape.head_dim,
          "] does not match the registered model's H_kv=", m.num_kv_heads, ", d=", m.head_dim));
    }
    if (v.shape.has_queries && v.shape.num_query_heads != m.num_query_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".queries.shape[0]: H_q=", v.shape.num_query_heads,
          " does not match the registered model's H_q=", m.num_query_heads));
    }
  }
  // Budget against n.
  const Budget& b = policy.settings.budget;
  if (!b.by_fraction && b.keep_tokens > v.shape.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": budget.keep_tokens=", b.keep_tokens, " exceeds n=", v.shape.num_tokens,
        " tokens of this layer"));
  }
  // Scalars.
  if (!std::isfinite(layer.softmax_scale) || layer.softmax_scale < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".softmax_scale: must be finite and >= 0 (0 = 1/sqrt(d)), got ", layer.softmax_scale));
  }
  v.softmax_scale = layer.softmax_scale > 0
                        ? layer.softmax_scale
                        : static_cast<float>(1.0 / std::sqrt(static_cast<double>(v.shape.head_dim)));
  const int64_t kept = KeptCount(b, v.shape.num_tokens);
  KVTRIM_RETURN_IF_ERROR(scorer.validate(v.shape, policy.params, kept, field));
  // Device tensors (CUDA IPC regions) need a backend that reads device memory in place.
  const std::pair<const TensorView*, const char*> tensors[] = {
      {&k, ".keys"}, {&layer.values, ".values"}, {&layer.queries, ".queries"}};
  for (const auto& [tensor, name] : tensors) {
    if (tensor->present() && !tensor->host_readable() && !backend_.reads_device_memory()) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, name, tensor->on_device() ? ": a device tensor (cuda_ipc)"
                                           : ": a page-locked host_shm tensor",
          " needs the GPU backend; this kvtrimd computes on the ", backend_.name(),
          tensor->on_device() ? " (send host_shm or inline_data)" : ""));
    }
  }
  // Values must be finite (last: it reads every byte). Device and pinned host tensors are
  // checked by the backend on the device, with the same message; so are keys the backend
  // checks on its own read of them (ChecksKeysFinite: one pass over memory, not two).
  const bool backend_checks_keys = backend_.ChecksKeysFinite(policy);
  for (const auto& [tensor, name] : tensors) {
    if (!tensor->present() || !tensor->host_readable()) continue;
    if (tensor == &k && backend_checks_keys) {
      v.unchecked_keys_field = field + name;
      continue;
    }
    KVTRIM_RETURN_IF_ERROR(CheckFinite(*tensor, field + name));
  }
  v.layer_id = layer.layer_id;
  v.num_layers = std::max(policy.settings.num_layers, layer.layer_id + 1);
  v.keys = k;
  v.values = layer.values;
  v.queries = layer.queries;
  v.seed = policy.settings.seed;
  v.ready_event = layer.ready_event;
  if (layer.output.present) {
    if (policy.model_wide()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".output: model-wide policies answer every layer at finish; output regions "
          "serve per-layer policies"));
    }
    if (layer.output.device != nullptr && !backend_.reads_device_memory()) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".output: a device output region (cuda_ipc) needs the GPU backend; this "
          "kvtrimd computes on the ", backend_.name()));
    }
    const bool one_list = policy.settings.output_shape == OutputShape::kShared ||
                          policy.settings.output_shape == OutputShape::kBlockAligned;
    const int64_t lists = one_list ? 1 : v.shape.num_kv_heads;
    const uint64_t needed = OutputTargetBytes(lists, v.shape.num_tokens);
    if (layer.output.capacity < needed) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".output: the region holds ", layer.output.capacity,
          " bytes from the offset, but ", lists, " lists over n=", v.shape.num_tokens,
          " tokens need up to ", needed, " (8 (L + 1) + 4 L n)"));
    }
    v.output = layer.output;
  }
  return v;
}

LayerBudget BudgetFor(const ResolvedPolicy& policy, int64_t n) {
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy.settings.budget, n);
  Protection requested = policy.scorer->default_protection(policy.params, budget.kept_per_head);
  if (policy.settings.sink_tokens) requested.sink = *policy.settings.sink_tokens;
  if (policy.settings.recent_tokens) requested.recent = *policy.settings.recent_tokens;
  budget.protection = ClampProtection(requested, budget.kept_per_head, n);
  budget.requested = requested;
  return budget;
}

bool ResolvedPolicy::model_wide() const {
  if (scorer == nullptr || scorer->kind != ScorerKind::kLaProx) return false;
  // Under max_perturbation LaProx ranks each head on its own, as EQUAL_COUNT does.
  if (settings.output_shape == OutputShape::kEqualCount || settings.budget.by_perturbation) {
    return false;
  }
  const LaProxMode mode = params.Enum<LaProxMode>("mode");
  return mode == LaProxMode::kModel || mode == LaProxMode::kModelRaw;
}

absl::StatusOr<LayerScores> PolicyEngine::ScoreLayer(const ResolvedPolicy& policy,
                                                     const LayerRequest& layer,
                                                     const std::string& field,
                                                     double* compute_seconds) const {
  auto validated = Validate(policy, layer, field);
  if (!validated.ok()) return validated.status();
  return ScoreValidated(policy, *validated, field, compute_seconds);
}

absl::StatusOr<LayerScores> PolicyEngine::ScoreValidated(const ResolvedPolicy& policy,
                                                         const ValidatedLayer& validated,
                                                         const std::string& field,
                                                         double* compute_seconds) const {
  LayerScores scores;
  scores.layer_id = validated.layer_id;
  scores.num_layers = validated.num_layers;
  scores.num_heads = validated.shape.num_kv_heads;
  scores.num_tokens = validated.shape.num_tokens;
  scores.budget = BudgetFor(policy, scores.num_tokens);
  const auto start = std::chrono::steady_clock::now();
  if (auto st = backend_.ScoreLayerForModelWide(policy, validated, scores.budget, &scores);
      !st.ok()) {
    return QualifyLayerError(st, field);
  }
  *compute_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return scores;
}

absl::StatusOr<std::vector<LayerDecision>> PolicyEngine::DecideModelWide(
    const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) const {
  return backend_.DecideModelWide(policy, layers);
}

absl::StatusOr<LayerDecision> PolicyEngine::CompressLayer(const ResolvedPolicy& policy,
                                                          const LayerRequest& layer,
                                                          const std::string& field) const {
  auto validated = Validate(policy, layer, field);
  if (!validated.ok()) return validated.status();
  return CompressValidated(policy, *validated, field);
}

absl::StatusOr<LayerDecision> PolicyEngine::CompressValidated(const ResolvedPolicy& policy,
                                                              const ValidatedLayer& validated,
                                                              const std::string& field) const {
  const LayerBudget budget = BudgetFor(policy, validated.shape.num_tokens);
  LayerDecision decision;
  const auto start = std::chrono::steady_clock::now();
  if (policy.settings.budget.by_perturbation) {
    // The bisection is the engine's (backend-agnostic); the backend scores and evaluates.
    const PerturbationSearch search = [&policy](const LayerScores& scores,
                                                PerturbationProbe& probe, LayerDecision* out) {
      return DecidePerturbationBudget(policy, scores, probe, out);
    };
    if (auto st = backend_.CompressByPerturbation(policy, validated, budget, search, &decision);
        !st.ok()) {
      return QualifyLayerError(st, field);
    }
  } else if (auto st = backend_.CompressLayer(policy, validated, budget, &decision); !st.ok()) {
    return QualifyLayerError(st, field);
  }
  decision.compute_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return decision;
}

}  // namespace kvtrim
