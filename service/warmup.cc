#include "service/warmup.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace kvtrim::service {

namespace {

constexpr int64_t kKvHeads = 2;    // H_kv
constexpr int64_t kQueryHeads = 4; // H_q
constexpr int64_t kTokens = 64;    // n
constexpr int64_t kHeadDim = 8;    // d
constexpr int64_t kWindow = 32;    // w

/// Deterministic values in [-1, 1) from a 64-bit LCG.
std::vector<float> SyntheticValues(int64_t count, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(count));
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(static_cast<double>(state >> 40) / static_cast<double>(1ULL << 24)) *
            2.0f - 1.0f;
  }
  return out;
}

}  // namespace

absl::Status WarmUp(const PolicyEngine& engine, WarmUpReport* report) {
  const std::vector<float> keys = SyntheticValues(kKvHeads * kTokens * kHeadDim, 1);    // [2, 64, 8]
  const std::vector<float> values = SyntheticValues(kKvHeads * kTokens * kHeadDim, 2);  // [2, 64, 8]
  const std::vector<float> queries = SyntheticValues(kQueryHeads * kWindow * kHeadDim, 3);  // [4, 32, 8]
  LayerRequest layer;
  layer.layer_id = 1;
  layer.keys = TensorView{keys.data(), DType::kF32, {kKvHeads, kTokens, kHeadDim}};
  layer.values = TensorView{values.data(), DType::kF32, {kKvHeads, kTokens, kHeadDim}};
  layer.queries = TensorView{queries.data(), DType::kF32, {kQueryHeads, kWindow, kHeadDim}};

  for (const PolicyPreset& preset : engine.registry().presets()) {
    const ScorerSpec* scorer = engine.registry().FindScorer(preset.scorer);
    const AllocatorSpec* allocator = engine.registry().FindAllocator(preset.allocator);
    if (scorer == nullptr || allocator == nullptr) {
      return absl::InternalError(
          absl::StrCat("warm-up: preset '", preset.name, "' names a missing part"));
    }
    if ((scorer->required_inputs & (kInputModel | kInputProfile)) != 0 ||
        scorer->scope == DecisionScope::kModel || allocator->scope == DecisionScope::kModel) {
      report->skipped.push_back(preset.name);
      continue;
    }
    CompressionSettings settings;
    settings.policy = preset.name;
    settings.budget.by_fraction = true;
    settings.budget.keep_fraction = 0.5;
    settings.num_layers = 4;
    auto policy = engine.Prepare(settings, "warmup");
    if (!policy.ok()) {
      return absl::InternalError(absl::StrCat("warm-up of preset '", preset.name,
                                              "' failed in Prepare: ", policy.status().ToString()));
    }
    auto decision = engine.CompressLayer(*policy, layer, "warmup.layer");
    if (!decision.ok()) {
      return absl::InternalError(absl::StrCat("warm-up of preset '", preset.name,
                                              "' failed: ", decision.status().ToString()));
    }
    const size_t lists = decision->output_shape == OutputShape::kShared ? 1 : kKvHeads;
    if (decision->offsets.size() != lists + 1 ||
        decision->offsets.back() != static_cast<int64_t>(decision->indices.size()) ||
        decision->kept_per_head.size() != static_cast<size_t>(kKvHeads)) {
      return absl::InternalError(absl::StrCat("warm-up of preset '", preset.name,
                                              "' returned a malformed decision"));
    }
    report->warmed.push_back(preset.name);
  }
  return absl::OkStatus();
}

}  // namespace kvtrim::service
