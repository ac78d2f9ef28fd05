#include "service/warmup.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>

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

/// f32 raw tensor of `shape` filled with synthetic values.
RawTensor SyntheticTensor(std::vector<int64_t> shape, uint64_t seed, float scale = 1.0f) {
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<float> values = SyntheticValues(count, seed);
  RawTensor t;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i] * scale;
    std::memcpy(t.bytes.data() + i * sizeof(float), &v, sizeof(float));
  }
  return t;
}

/// A synthetic model of the warm-up layout (4 layers, H_q = 4, H_kv = 2, d = 8, D = 16) with
/// query statistics (identity covariance) and a flat LU-KV profile (window 32) for each scorer
/// of `profiled` (the scorers the lukv presets wrap), so that the model-aware policies are
/// exercised before SERVING too.
std::shared_ptr<const RegisteredModel> SyntheticModel(const std::set<std::string>& profiled) {
  ModelInput in;
  in.layout = {"warm-up", 4, kQueryHeads, kKvHeads, kHeadDim, 16};
  for (int l = 0; l < 4; ++l) {
    in.tensors[absl::StrCat("layers.", l, ".w_o")] =
        SyntheticTensor({16, kQueryHeads * kHeadDim}, 10 + l, 0.3f);
    in.tensors[absl::StrCat("layers.", l, ".query_mean")] =
        SyntheticTensor({kQueryHeads, kHeadDim}, 20 + l);
    RawTensor cov = SyntheticTensor({kQueryHeads, kHeadDim, kHeadDim}, 30 + l, 0.0f);
    for (int64_t q = 0; q < kQueryHeads; ++q) {
      for (int64_t i = 0; i < kHeadDim; ++i) {
        const float one = 1.0f;
        std::memcpy(cov.bytes.data() + ((q * kHeadDim + i) * kHeadDim + i) * sizeof(float), &one,
                    sizeof(float));
      }
    }
    in.tensors[absl::StrCat("layers.", l, ".query_cov")] = std::move(cov);
  }
  for (const std::string& metric : profiled) {
    ProfileInput profile;
    profile.metric = metric;
    profile.window = kWindow;
    profile.ratios = SyntheticTensor({kLukvProfileRows, 4, kKvHeads}, 40, 0.0f);
    float* ratios = reinterpret_cast<float*>(profile.ratios.bytes.data());
    for (int64_t r = 0; r < kLukvProfileRows; ++r) {
      for (int64_t i = 0; i < 4 * kKvHeads; ++i) {
        ratios[r * 4 * kKvHeads + i] = static_cast<float>(r + 1) / 100.0f;
      }
    }
    in.profiles[metric] = std::move(profile);
  }
  auto model = BuildModel(std::move(in));
  if (!model.ok()) return nullptr;
  (*model)->digest = "sha256:warm-up";
  return *model;
}

}  // namespace

absl::Status WarmUp(const PolicyEngine& engine, const Backend& backend, WarmUpReport* report) {
  const std::vector<float> keys = SyntheticValues(kKvHeads * kTokens * kHeadDim, 1);    // [2, 64, 8]
  const std::vector<float> values = SyntheticValues(kKvHeads * kTokens * kHeadDim, 2);  // [2, 64, 8]
  const std::vector<float> queries = SyntheticValues(kQueryHeads * kWindow * kHeadDim, 3);  // [4, 32, 8]
  LayerRequest layer;
  layer.layer_id = 1;
  layer.keys = TensorView{keys.data(), DType::kF32, {kKvHeads, kTokens, kHeadDim}};
  layer.values = TensorView{values.data(), DType::kF32, {kKvHeads, kTokens, kHeadDim}};
  layer.queries = TensorView{queries.data(), DType::kF32, {kQueryHeads, kWindow, kHeadDim}};

  // The scorers the presets' LU-KV allocators read a profile of (the preset's scorer).
  std::set<std::string> profiled;
  for (const PolicyPreset& preset : engine.registry().presets()) {
    const AllocatorSpec* allocator = engine.registry().FindAllocator(preset.allocator);
    if (allocator != nullptr && allocator->kind == AllocatorKind::kLukv) {
      profiled.insert(preset.scorer);
    }
  }
  const std::shared_ptr<const RegisteredModel> model = SyntheticModel(profiled);
  if (model == nullptr) return absl::InternalError("warm-up: the synthetic model is invalid");
  for (const PolicyPreset& preset : engine.registry().presets()) {
    const ScorerSpec* scorer = engine.registry().FindScorer(preset.scorer);
    const AllocatorSpec* allocator = engine.registry().FindAllocator(preset.allocator);
    if (scorer == nullptr || allocator == nullptr) {
      return absl::InternalError(
          absl::StrCat("warm-up: preset '", preset.name, "' names a missing part"));
    }
    for (Numerics mode : backend.NumericsModes(*scorer, *allocator)) {
      const std::string what =
          absl::StrCat("warm-up of preset '", preset.name, "' (", NumericsName(mode), ")");
      CompressionSettings settings;
      settings.policy = preset.name;
      settings.budget.by_fraction = true;
      settings.budget.keep_fraction = 0.5;
      settings.num_layers = 4;
      settings.numerics = mode;
      auto policy = engine.Prepare(settings, "warmup");
      if (!policy.ok()) {
        return absl::InternalError(
            absl::StrCat(what, " failed in Prepare: ", policy.status().ToString()));
      }
      const uint32_t needs = scorer->required_inputs | allocator->required_inputs;
      if (auto st =
              engine.AttachModel(&*policy, (needs & kInputModel) ? model : nullptr, "warmup");
          !st.ok()) {
        return absl::InternalError(absl::StrCat(what, " failed in AttachModel: ", st.ToString()));
      }
      auto decision = engine.CompressLayer(*policy, layer, "warmup.layer");
      if (!decision.ok()) {
        return absl::InternalError(absl::StrCat(what, " failed: ", decision.status().ToString()));
      }
      const size_t lists = decision->output_shape == OutputShape::kShared ? 1 : kKvHeads;
      if (decision->offsets.size() != lists + 1 ||
          decision->offsets.back() != static_cast<int64_t>(decision->indices.size()) ||
          decision->kept_per_head.size() != static_cast<size_t>(kKvHeads)) {
        return absl::InternalError(absl::StrCat(what, " returned a malformed decision"));
      }
    }
    report->warmed.push_back(preset.name);
  }
  return absl::OkStatus();
}

}  // namespace kvtrim::service
