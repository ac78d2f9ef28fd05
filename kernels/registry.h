// The registry of every scorer, allocator and named policy the server serves.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/policy_spec.h"

namespace kvtrim {

/// Holds the policy parts and presets. Built once at start-up by RegisterBuiltinPolicies()
/// and passed by const reference to whoever needs it; never a singleton.
class PolicyRegistry {
 public:
  void AddScorer(ScorerSpec spec);
  void AddAllocator(AllocatorSpec spec);
  void AddPreset(PolicyPreset preset);

  /// Resolves `settings.policy` (a preset or "SCORER+ALLOCATOR") with its parameter
  /// overrides. Errors, all INVALID_ARGUMENT: `field_prefix` + ".policy.name" for an unknown
  /// policy or a composition CheckComposable refuses; + ".output_shape" for a shape
  /// OutputShapes does not list; + ".policy.params.<name>" for a bad parameter.
  absl::StatusOr<ResolvedPolicy> Resolve(const CompressionSettings& settings,
                                         const std::string& field_prefix) const;

  /// The composability rule, the one place that says which scorer + allocator pairs can
  /// serve a request (Resolve refuses the others; ListPolicies does not list them). OK, or
  /// INVALID_ARGUMENT with the reason (no field name). laprox selects by its own top-K
  /// (policy.params.mode: per head, per layer or model-wide) and composes with the uniform
  /// allocator only; every other scorer composes with every allocator.
  static absl::Status CheckComposable(const ScorerSpec& scorer, const AllocatorSpec& allocator);

  /// The output shapes a composable scorer + allocator answers with, in enum order: every
  /// shape, except laprox: kPerHead (ragged) and kEqualCount (its top-K is defined per head
  /// list; SHARED and BLOCK_ALIGNED are not).
  static std::vector<OutputShape> OutputShapes(const ScorerSpec& scorer,
                                               const AllocatorSpec& allocator);

  const ScorerSpec* FindScorer(const std::string& name) const;
  const AllocatorSpec* FindAllocator(const std::string& name) const;
  const std::vector<PolicyPreset>& presets() const { return presets_; }
  std::vector<const ScorerSpec*> scorers() const;
  std::vector<const AllocatorSpec*> allocators() const;

  /// Parameters of a scorer + allocator composition (scorer's first).
  static std::vector<ParamSpec> CombinedParams(const ScorerSpec& s, const AllocatorSpec& a);

 private:
  std::map<std::string, std::unique_ptr<ScorerSpec>> scorers_;
  std::map<std::string, std::unique_ptr<AllocatorSpec>> allocators_;
  std::vector<PolicyPreset> presets_;
};

/// Registers every built-in scorer, allocator and preset. The single list of policies.
void RegisterBuiltinPolicies(PolicyRegistry* registry);

}  // namespace kvtrim
