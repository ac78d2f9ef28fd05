#include "kernels/engine.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtrim {

namespace {

/// Finds the first non-finite element of `t`; returns its flat index or -1.
int64_t FirstNonFinite(const TensorView& t) {
  const int64_t count = t.numel();
  switch (t.dtype) {
    case DType::kF32: {
      const auto* p = static_cast<const float*>(t.data);
      for (int64_t i = 0; i < count; ++i) {
        if (!std::isfinite(p[i])) return i;
      }
      return -1;
    }
    case DType::kF16: {  // exponent bits all ones = inf or NaN
      const auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < count; ++i) {
        if ((p[i] & 0x7C00u) == 0x7C00u) return i;
      }
      return -1;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < count; ++i) {
        if ((p[i] & 0x7F80u) == 0x7F80u) return i;
      }
      return -1;
    }
  }
  return -1;
}

absl::Status CheckFinite(const TensorView& t, const std::string& field) {
  const int64_t i = FirstNonFinite(t);
  if (i < 0) return absl::OkStatus();
  float value = 0;
  ConvertToF32(t.dtype, static_cast<const char*>(t.data) + i * DTypeSize(t.dtype), 1, &value);
  const int64_t a = i / (t.shape[1] * t.shape[2]);
  const int64_t b = (i / t.shape[2]) % t.shape[1];
  const int64_t c = i % t.shape[2];
  return absl::InvalidArgumentError(absl::StrCat(field, ": contains ",
                                                 std::isnan(value) ? "NaN" : "Inf", " at [", a,
                                                 ", ", b, ", ", c, "]"));
}

std::string ShapeString(const TensorView& t) {
  return absl::StrCat("[", t.shape[0], ", ", t.shape[1], ", ", t.shape[2], "]");
}

}  // namespace

PolicyEngine::PolicyEngine(const PolicyRegistry& registry, Backend& backend, EngineLimits limits)
    : registry_(registry), backend_(backend), limits_(limits) {}

absl::StatusOr<ResolvedPolicy> PolicyEngine::Prepare(const CompressionSettings& settings,
                                                     const std::string& field_prefix) const {
  const Budget& b = settings.budget;
  if (b.by_fraction) {
    if (!(b.keep_fraction > 0.0 && b.keep_fraction <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_prefix, ".budget.keep_fraction: must be in (0, 1], got ",
                       b.keep_fraction));
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
  if (settings.num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field_prefix, ".num_layers: must be >= 0, got ",
                                                   settings.num_layers));
  }
  return registry_.Resolve(settings, field_prefix);
}

absl::StatusOr<ValidatedLayer> PolicyEngine::Validate(const ResolvedPolicy& policy,
                                                      const LayerRequest& layer,
                                                      const std::string& field) const {
  const ScorerSpec& scorer = *policy.scorer;
  ValidatedLayer v;
  if (layer.layer_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".layer_id: must be >= 0, got ", layer.layer_id));
  }
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
  if (auto st = scorer.validate(v.shape, policy.params, kept, field); !st.ok()) return st;
  // Values must be finite (last: it reads every byte).
  if (auto st = CheckFinite(k, field + ".keys"); !st.ok()) return st;
  if (v.shape.has_values) {
    if (auto st = CheckFinite(layer.values, field + ".values"); !st.ok()) return st;
  }
  if (v.shape.has_queries) {
    if (auto st = CheckFinite(layer.queries, field + ".queries"); !st.ok()) return st;
  }
  v.layer_id = layer.layer_id;
  v.num_layers = std::max(policy.settings.num_layers, layer.layer_id + 1);
  v.keys = k;
  v.values = layer.values;
  v.queries = layer.queries;
  v.seed = policy.settings.seed;
  return v;
}

absl::StatusOr<LayerDecision> PolicyEngine::CompressLayer(const ResolvedPolicy& policy,
                                                          const LayerRequest& layer,
                                                          const std::string& field) const {
  auto validated = Validate(policy, layer, field);
  if (!validated.ok()) return validated.status();
  const int64_t n = validated->shape.num_tokens;
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy.settings.budget, n);
  Protection requested = policy.scorer->default_protection(policy.params, budget.kept_per_head);
  if (policy.settings.sink_tokens) requested.sink = *policy.settings.sink_tokens;
  if (policy.settings.recent_tokens) requested.recent = *policy.settings.recent_tokens;
  budget.protection = ClampProtection(requested, budget.kept_per_head, n);

  LayerDecision decision;
  const auto start = std::chrono::steady_clock::now();
  if (auto st = backend_.CompressLayer(policy, *validated, budget, &decision); !st.ok()) {
    return st;
  }
  decision.compute_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return decision;
}

}  // namespace kvtrim
