// Backend-independent descriptions of scorers, allocators and named policy presets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/budget.h"
#include "kernels/layer.h"
#include "kernels/model.h"
#include "kernels/params.h"
#include "kernels/policy_kind.h"

namespace kvtrim {

/// Bit flags of the inputs a policy reads.
enum PolicyInputBits : uint32_t {
  kInputKeys = 1u << 0,
  kInputValues = 1u << 1,
  kInputQueries = 1u << 2,
  kInputModel = 1u << 3,
  kInputProfile = 1u << 4,
};

/// The scope at which a policy couples its decisions.
enum class DecisionScope { kHead, kLayer, kModel };

/// Describes a scorer: one retention score per (KV head, token), higher = keep.
struct ScorerSpec {
  std::string name;
  ScorerKind kind = ScorerKind::kTable;  // the typed identity of `name` (kTable: by name)
  std::string description;
  std::string paper;
  uint32_t required_inputs = kInputKeys;
  uint32_t optional_inputs = 0;
  /// False when the scores come from token positions or a hash alone (streaming_llm,
  /// random): the keys are read for their shape only, never for their values.
  bool reads_key_values = true;
  std::vector<ParamSpec> params;
  DecisionScope scope = DecisionScope::kHead;
  int32_t doc_default_sink = 0;        // for ListPolicies
  std::string doc_default_recent = "0";  // for ListPolicies, e.g. "window"
  /// Protection before rule 3, from the parameters and the uniform per-head budget k.
  std::function<Protection(const ResolvedParams& params, int64_t k)> default_protection;
  /// Checks constraints between the layer's shape and the parameters (e.g. enough query
  /// rows for the window). Errors are INVALID_ARGUMENT naming `field` (the layer prefix).
  std::function<absl::Status(const LayerShape& shape, const ResolvedParams& params, int64_t k,
                             const std::string& field)>
      validate;
};

/// Describes an allocator: how many tokens each head of a layer keeps.
struct AllocatorSpec {
  std::string name;
  AllocatorKind kind = AllocatorKind::kUniform;  // the typed identity of `name`
  std::string description;
  std::string paper;
  std::vector<ParamSpec> params;
  DecisionScope scope = DecisionScope::kHead;
  uint32_t required_inputs = 0;   // kInputModel | kInputProfile for lukv
};

/// A named policy: a preset of scorer + allocator (+ selector).
struct PolicyPreset {
  std::string name;
  std::string description;
  std::string scorer;
  std::string allocator;
  std::string selector = "topk";
};

/// A policy resolved for one request: its parts, validated parameters and settings.
struct ResolvedPolicy {
  std::string name;                 // as requested
  const ScorerSpec* scorer = nullptr;
  const AllocatorSpec* allocator = nullptr;
  std::string selector = "topk";
  ResolvedParams params;            // scorer and allocator parameters together
  CompressionSettings settings;
  /// The registered model named by settings.model_digest (nullptr when none). Immutable and
  /// shared: it outlives the request even if the model is deleted meanwhile.
  std::shared_ptr<const RegisteredModel> model;

  /// True when the decision needs every layer before any selection (LaProx model modes).
  bool model_wide() const;
};

}  // namespace kvtrim
