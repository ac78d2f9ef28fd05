#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/allocate.h"
#include "kernels/cpu/perturbation.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/select.h"

namespace kvtrim {

CpuBackend::CpuBackend(int num_threads)
    : pool_(num_threads),
      scorers_{{"streaming_llm", &ScoreStreamingLlm}, {"random", &ScoreRandom},
               {"knorm", &ScoreKnorm},                {"keydiff", &ScoreKeyDiff},
               {"snapkv", &ScoreSnapKV},              {"h2o", &ScoreH2O},
               {"tova", &ScoreTova},                  {"dropkv", &ScoreDropKV}} {}

void ApplyProtection(const Protection& p, int64_t num_heads, int64_t n, float* scores) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < num_heads; ++h) {
    float* s = scores + h * n;
    for (int64_t j = 0; j < p.sink && j < n; ++j) s[j] = inf;
    for (int64_t j = std::max<int64_t>(0, n - p.recent); j < n; ++j) s[j] = inf;
  }
}

absl::Status CpuBackend::ScoreLayer(const ResolvedPolicy& policy, const CpuLayer& layer,
                                    const LayerBudget& budget, std::vector<float>* scores) {
  auto it = scorers_.find(policy.scorer->name);
  if (it == scorers_.end()) {
    return absl::UnimplementedError(
        absl::StrCat("scorer '", policy.scorer->name, "' has no CPU implementation"));
  }
  const int64_t heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  scores->assign(static_cast<size_t>(heads * n), 0.0f);
  if (auto st = it->second(layer, policy.params, pool_, scores->data()); !st.ok()) return st;
  for (int64_t i = 0; i < heads * n; ++i) {
    if (std::isnan((*scores)[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "keys: scorer '", policy.scorer->name, "' produced NaN for head ", i / n, " token ",
          i % n, "; the input magnitudes overflow fp32 arithmetic"));
    }
  }
  ApplyProtection(budget.protection, heads, n, scores->data());
  return absl::OkStatus();
}

absl::Status CpuBackend::CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                       const LayerBudget& budget, LayerDecision* out) {
  const CpuLayer cpu = CpuLayer::From(layer);
  const int64_t heads = cpu.shape.num_kv_heads;
  const int64_t n = cpu.shape.num_tokens;
  std::vector<float> scores;
  if (auto st = ScoreLayer(policy, cpu, budget, &scores); !st.ok()) return st;

  // Allocation: tokens kept per head.
  std::vector<int64_t> counts;
  const std::string& allocator = policy.allocator->name;
  if (allocator == "pyramid") {
    const int64_t protected_tokens = budget.protection.sink + budget.protection.recent;
    const int64_t layer_k =
        PyramidLayerBudget(budget.kept_per_head, n, cpu.layer_id, cpu.num_layers,
                           policy.params.Number("beta"), protected_tokens);
    counts = AllocateUniform(heads, layer_k);
  } else if (allocator == "adakv") {
    counts = AllocateAdaKV(scores.data(), heads, n, budget.kept_per_head,
                           policy.params.Number("safeguard_alpha"));
  } else {
    counts = AllocateUniform(heads, budget.kept_per_head);
  }

  // Selection.
  out->layer_id = cpu.layer_id;
  out->num_tokens = n;
  out->output_shape = policy.settings.output_shape;
  out->offsets.assign(1, 0);
  out->indices.clear();
  out->kept_per_head.assign(static_cast<size_t>(heads), 0);
  if (policy.settings.output_shape == OutputShape::kShared) {
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t shared = std::clamp<int64_t>(
        RoundHalfUp(static_cast<double>(total) / static_cast<double>(heads)), 1, n);
    SelectSharedRoundRobin(scores.data(), heads, n, shared, &out->indices);
    out->offsets.push_back(static_cast<int64_t>(out->indices.size()));
    for (auto& kept : out->kept_per_head) kept = static_cast<int32_t>(out->indices.size());
  } else {
    std::vector<std::vector<int32_t>> per_head(static_cast<size_t>(heads));
    pool_.ParallelFor(heads, [&](int64_t h) {
      SelectTopK(scores.data() + h * n, n, counts[h], &per_head[h]);
    });
    for (int64_t h = 0; h < heads; ++h) {
      out->indices.insert(out->indices.end(), per_head[h].begin(), per_head[h].end());
      out->offsets.push_back(static_cast<int64_t>(out->indices.size()));
      out->kept_per_head[h] = static_cast<int32_t>(per_head[h].size());
    }
  }

  // Exact output perturbation on the observation window.
  out->perturbation.clear();
  if (cpu.shape.has_values && cpu.shape.has_queries) {
    out->perturbation.assign(static_cast<size_t>(heads), 0.0);
    OutputPerturbation(cpu, out->offsets, out->indices, pool_, out->perturbation.data());
  }
  return absl::OkStatus();
}

}  // namespace kvtrim
