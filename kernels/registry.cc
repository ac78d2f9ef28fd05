#include "kernels/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/client_text.h"

namespace kvtrim {

namespace {

/// The API spelling of `shape` ("PER_HEAD", as kvtrim.proto's OutputShape), for messages.
const char* OutputShapeName(OutputShape shape) {
  switch (shape) {
    case OutputShape::kPerHead: return "PER_HEAD";
    case OutputShape::kShared: return "SHARED";
    case OutputShape::kBlockAligned: return "BLOCK_ALIGNED";
    case OutputShape::kEqualCount: return "EQUAL_COUNT";
  }
  return "?";
}

}  // namespace

void PolicyRegistry::AddScorer(ScorerSpec spec) {
  auto name = spec.name;
  scorers_[name] = std::make_unique<ScorerSpec>(std::move(spec));
}

void PolicyRegistry::AddAllocator(AllocatorSpec spec) {
  auto name = spec.name;
  allocators_[name] = std::make_unique<AllocatorSpec>(std::move(spec));
}

void PolicyRegistry::AddPreset(PolicyPreset preset) { presets_.push_back(std::move(preset)); }

const ScorerSpec* PolicyRegistry::FindScorer(const std::string& name) const {
  auto it = scorers_.find(name);
  return it == scorers_.end() ? nullptr : it->second.get();
}

const AllocatorSpec* PolicyRegistry::FindAllocator(const std::string& name) const {
  auto it = allocators_.find(name);
  return it == allocators_.end() ? nullptr : it->second.get();
}

std::vector<const ScorerSpec*> PolicyRegistry::scorers() const {
  std::vector<const ScorerSpec*> out;
  for (const auto& [name, spec] : scorers_) out.push_back(spec.get());
  return out;
}

std::vector<const AllocatorSpec*> PolicyRegistry::allocators() const {
  std::vector<const AllocatorSpec*> out;
  for (const auto& [name, spec] : allocators_) out.push_back(spec.get());
  return out;
}

std::vector<ParamSpec> PolicyRegistry::CombinedParams(const ScorerSpec& s, const AllocatorSpec& a) {
  std::vector<ParamSpec> params = s.params;
  params.insert(params.end(), a.params.begin(), a.params.end());
  return params;
}

absl::Status PolicyRegistry::CheckComposable(const ScorerSpec& scorer,
                                             const AllocatorSpec& allocator) {
  if (scorer.kind == ScorerKind::kLaProx && allocator.kind != AllocatorKind::kUniform) {
    return absl::InvalidArgumentError(absl::StrCat(
        "laprox allocates by its own top-K (policy.params.mode) and composes with the uniform "
        "allocator only, not '", allocator.name, "'"));
  }
  return absl::OkStatus();
}

std::vector<OutputShape> PolicyRegistry::OutputShapes(const ScorerSpec& scorer,
                                                      const AllocatorSpec& allocator) {
  (void)allocator;  // every allocator answers every shape its scorer allows
  if (scorer.kind == ScorerKind::kLaProx) return {OutputShape::kPerHead, OutputShape::kEqualCount};
  return {OutputShape::kPerHead, OutputShape::kShared, OutputShape::kBlockAligned,
          OutputShape::kEqualCount};
}

absl::StatusOr<ResolvedPolicy> PolicyRegistry::Resolve(const CompressionSettings& settings,
                                                       const std::string& field_prefix) const {
  const std::string name_field = absl::StrCat(field_prefix, ".policy.name");
  std::string scorer_name;
  std::string allocator_name;
  std::string selector = "topk";
  for (const auto& preset : presets_) {
    if (preset.name == settings.policy) {
      scorer_name = preset.scorer;
      allocator_name = preset.allocator;
      selector = preset.selector;
    }
  }
  if (scorer_name.empty()) {
    const auto plus = settings.policy.find('+');
    if (plus != std::string::npos) {
      scorer_name = settings.policy.substr(0, plus);
      allocator_name = settings.policy.substr(plus + 1);
    }
  }
  const ScorerSpec* scorer = FindScorer(scorer_name);
  const AllocatorSpec* allocator = FindAllocator(allocator_name);
  if (settings.policy.empty() || scorer == nullptr || allocator == nullptr) {
    std::vector<std::string> names;
    for (const auto& p : presets_) names.push_back(p.name);
    std::vector<std::string> parts;
    for (const auto& [n, s] : allocators_) parts.push_back(n);
    if (settings.policy.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name_field, ": is empty; known policies: ",
                                                     absl::StrJoin(names, ", ")));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        name_field, ": unknown policy ", QuoteClientText(settings.policy), "; known policies: ",
        absl::StrJoin(names, ", "), "; or SCORER+ALLOCATOR with allocator one of ",
        absl::StrJoin(parts, ", ")));
  }
  if (absl::Status composable = CheckComposable(*scorer, *allocator); !composable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name_field, ": policy '", settings.policy,
                                                   "' cannot be served: ",
                                                   composable.message()));
  }
  const std::vector<OutputShape> shapes = OutputShapes(*scorer, *allocator);
  if (std::find(shapes.begin(), shapes.end(), settings.output_shape) == shapes.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field_prefix, ".output_shape: policy '", settings.policy, "' answers ",
        absl::StrJoin(shapes, " or ",
                      [](std::string* out, OutputShape s) { out->append(OutputShapeName(s)); }),
        " lists, not ", OutputShapeName(settings.output_shape)));
  }
  auto params = ResolvedParams::Resolve(CombinedParams(*scorer, *allocator), settings.params,
                                        absl::StrCat(field_prefix, ".policy.params"));
  if (!params.ok()) return params.status();
  ResolvedPolicy policy;
  policy.name = settings.policy;
  policy.scorer = scorer;
  policy.allocator = allocator;
  policy.selector = selector;
  policy.params = *std::move(params);
  policy.settings = settings;
  return policy;
}

}  // namespace kvtrim
