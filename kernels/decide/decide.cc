#include "kernels/decide/decide.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/budget.h"
#include "kernels/canonical_math.h"
#include "kernels/decide/allocate.h"
#include "kernels/decide/select.h"
#include "kernels/decide/lukv_budget.h"
#include "kernels/decide/protection.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// Appends one head's (or one shared) list to the CSR of `out`.
void AppendList(const std::vector<int32_t>& list, LayerDecision* out) {
  out->indices.insert(out->indices.end(), list.begin(), list.end());
  out->offsets.push_back(static_cast<int64_t>(out->indices.size()));
}

/// Order-preserving unsigned key of a float (no NaN): larger float -> larger key.
uint32_t FloatKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

/// The k-th largest of values[0..count) (1 <= k <= count) by a two-pass 16-bit radix
/// select on FloatKey: O(count) with two 65536-bucket histograms.
float KthLargest(const float* values, size_t count, int64_t k) {
  std::vector<uint64_t> hist(65536);
  for (size_t i = 0; i < count; ++i) ++hist[FloatKey(values[i]) >> 16];
  uint32_t high = 65535;
  uint64_t above = 0;  // entries in buckets above `high`
  while (above + hist[high] < static_cast<uint64_t>(k)) above += hist[high--];
  std::fill(hist.begin(), hist.end(), 0);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t key = FloatKey(values[i]);
    if ((key >> 16) == high) ++hist[key & 0xFFFFu];
  }
  uint32_t low = 65535;
  while (above + hist[low] < static_cast<uint64_t>(k)) above += hist[low--];
  const uint32_t key = (high << 16) | low;
  const uint32_t bits = (key & 0x80000000u) ? key & 0x7FFFFFFFu : ~key;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

void StartDecision(const LayerScores& layer, OutputShape shape, LayerDecision* out) {
  out->layer_id = layer.layer_id;
  out->num_tokens = layer.num_tokens;
  out->output_shape = shape;
  out->offsets.assign(1, 0);
  out->indices.clear();
  out->kept_per_head.assign(static_cast<size_t>(layer.num_heads), 0);
  out->perturbation.clear();
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> AllocateCounts(const ResolvedPolicy& policy,
                                                    const LayerScores& layer,
                                                    const std::vector<float>& protected_scores) {
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  const int64_t k = layer.budget.kept_per_head;
  const AllocatorKind allocator = policy.allocator->kind;
  if (policy.settings.output_shape == OutputShape::kEqualCount ||
      allocator == AllocatorKind::kUniform) {
    return AllocateUniform(heads, k);
  }
  if (allocator == AllocatorKind::kPyramid) {
    const int64_t protected_tokens = layer.budget.protection.sink + layer.budget.protection.recent;
    return AllocateUniform(heads, PyramidLayerBudget(k, n, layer.layer_id, layer.num_layers,
                                                     policy.params.Number("beta"),
                                                     protected_tokens));
  }
  if (allocator == AllocatorKind::kAdaKV) {
    return AllocateAdaKV(protected_scores.data(), heads, n, k,
                         policy.params.Number("safeguard_alpha"));
  }
  if (allocator == AllocatorKind::kLukv) {
    const LukvProfile* profile =
        policy.model ? policy.model->FindProfile(policy.scorer->name) : nullptr;
    // PolicyEngine::AttachModel refused a lukv policy without the scorer's profile, and
    // Validate matched the layer to the model's layout: failing either is a caller that
    // skipped the engine (INTERNAL, naming no request field).
    if (profile == nullptr) {
      return absl::InternalError(absl::StrCat("lukv: no LU-KV profile for scorer '",
                                              policy.scorer->name, "' reached the decision"));
    }
    const ModelLayout& m = policy.model->layout;
    if (layer.layer_id >= m.num_layers || heads != m.num_kv_heads) {
      return absl::InternalError(absl::StrCat(
          "lukv: layer_id ", layer.layer_id, " / H_kv ", heads,
          " do not fit the profile's [99, L=", m.num_layers, ", H_kv=", m.num_kv_heads, "]"));
    }
    return LukvHeadBudgets(*profile, m.num_layers, m.num_kv_heads, layer.layer_id, n,
                           LukvEvictedRatio(policy.settings.budget, n),
                           policy.params.Bool("interpolate"));
  }
  // Every AllocatorKind is handled above; a new kind must add its rule here.
  return absl::InternalError(
      absl::StrCat("allocator '", policy.allocator->name, "' has no allocation rule"));
}

int64_t CriticalKVStage1Tokens(double alpha, int64_t count, const Protection& protection,
                               int64_t n) {
  const int64_t guarded = protection.sink + protection.recent;
  const int64_t b = std::max<int64_t>(0, count - guarded);
  const int64_t b1 = std::min(b, RoundHalfUp(alpha * static_cast<double>(b)));
  return std::min(n, guarded + b1);
}

absl::StatusOr<LayerRanking> RankLayer(const ResolvedPolicy& policy, const LayerScores& layer) {
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  const bool lukv = policy.allocator->kind == AllocatorKind::kLukv &&
                    policy.settings.output_shape != OutputShape::kEqualCount;

  // Protection: uniform (rule 3 on the uniform k), or per head on lukv's own counts.
  LayerRanking out;
  out.ranked = layer.scores;  // [H, n]
  if (!lukv) ApplyProtection(layer.budget.protection, heads, n, out.ranked.data());
  KVTRIM_ASSIGN_OR_RETURN(out.counts, AllocateCounts(policy, layer, out.ranked));
  out.protection.assign(static_cast<size_t>(heads), layer.budget.protection);
  if (lukv) {
    for (int64_t h = 0; h < heads; ++h) {
      out.protection[h] = ClampProtection(layer.budget.requested, out.counts[h], n);
      ApplyProtection(out.protection[h], 1, n, out.ranked.data() + h * n);
    }
  }
  if (layer.critical.empty()) return out;

  // CriticalKV: stage 1 = the top (protected + b1) by attention, b1 = round_half_up(alpha * b)
  // in double (specs README rule 6, over criticalkv.md's floor); the final ranking is the
  // stage-2 score with stage-1 tokens forced to +inf.
  const double alpha = policy.params.Number("alpha");
  std::vector<float> stage2 = layer.critical;
  std::vector<int32_t> stage1;
  for (int64_t h = 0; h < heads; ++h) {
    stage1.clear();
    SelectTopK(out.ranked.data() + h * n, n,
               CriticalKVStage1Tokens(alpha, out.counts[h], out.protection[h], n), &stage1);
    float* row = stage2.data() + h * n;
    ApplyProtection(out.protection[h], 1, n, row);
    for (int32_t j : stage1) row[j] = kInf;
  }
  out.ranked.swap(stage2);
  return out;
}

absl::Status DecideLayer(const ResolvedPolicy& policy, const LayerScores& layer,
                         LayerDecision* out) {
  const int64_t heads = layer.num_heads;
  const int64_t n = layer.num_tokens;
  const OutputShape shape = policy.settings.output_shape;
  KVTRIM_ASSIGN_OR_RETURN(LayerRanking ranking, RankLayer(policy, layer));
  const std::vector<float>& ranked = ranking.ranked;
  const std::vector<int64_t>& counts = ranking.counts;

  StartDecision(layer, shape, out);
  std::vector<int32_t> list;
  if (shape == OutputShape::kShared || shape == OutputShape::kBlockAligned) {
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const double mean = static_cast<double>(total) / static_cast<double>(heads);
    if (shape == OutputShape::kShared) {
      SelectSharedRoundRobin(ranked.data(), heads, n, std::clamp<int64_t>(RoundHalfUp(mean), 1, n),
                             &list);
    } else {
      const int64_t block = policy.settings.block_size;
      const int64_t blocks = (n + block - 1) / block;
      const int64_t wanted =
          std::clamp<int64_t>(RoundHalfUp(mean / static_cast<double>(block)), 1, blocks);
      SelectBlocks(ranked.data(), heads, n, block, wanted, &list);
    }
    AppendList(list, out);
    for (auto& kept : out->kept_per_head) kept = static_cast<int32_t>(list.size());
    return absl::OkStatus();
  }
  for (int64_t h = 0; h < heads; ++h) {
    list.clear();
    SelectTopK(ranked.data() + h * n, n, counts[h], &list);
    AppendList(list, out);
    out->kept_per_head[h] = static_cast<int32_t>(list.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<LaProxPlan> PlanLaProx(const ResolvedPolicy& policy) {
  const OutputShape shape = policy.settings.output_shape;
  const bool equal = shape == OutputShape::kEqualCount;
  // Prepare refused laprox with a SHARED or BLOCK_ALIGNED output: reaching here with one is
  // a caller that skipped the engine (INTERNAL, naming no request field).
  if (shape != OutputShape::kPerHead && !equal) {
    return absl::InternalError(
        "laprox: planned for an output shape other than PER_HEAD or EQUAL_COUNT");
  }
  const LaProxMode mode = policy.params.Enum<LaProxMode>("mode");
  LaProxPlan plan;
  if (equal || mode == LaProxMode::kLocal) {
    plan.scope = LaProxScope::kHead;
  } else if (mode == LaProxMode::kLayer) {
    plan.scope = LaProxScope::kLayer;
  } else {  // model, model_raw
    plan.scope = LaProxScope::kModel;
  }
  plan.normalize = mode == LaProxMode::kModel && !equal;
  return plan;
}

void NormalizeLaProxLayer(float* values, int64_t count) {
  std::vector<float> chunks(static_cast<size_t>(count / kCanonicalChunk + 1));
  const float z = CmChunkedSum(values, count, chunks.data());
  for (int64_t i = 0; i < count; ++i) values[i] = z > 0.0f ? CmDiv(values[i], z) : 0.0f;
}

absl::StatusOr<std::vector<LayerDecision>> DecideLaProx(const ResolvedPolicy& policy,
                                                        const std::vector<LayerScores>& layers) {
  absl::StatusOr<LaProxPlan> plan = PlanLaProx(policy);
  if (!plan.ok()) return plan.status();
  // Candidate entries: unprotected (layer, head, token) triples; their normalised scores.
  struct Span {
    size_t begin = 0;  // first candidate of the layer in `values`
    int64_t budget = 0;  // evictable tokens kept: H * (k - protected)
  };
  std::vector<Span> spans(layers.size());
  std::vector<float> values;
  size_t candidates = 0;
  for (const LayerScores& layer : layers) candidates += layer.scores.size();
  values.reserve(candidates);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerScores& layer = layers[l];
    const Protection& p = layer.budget.protection;
    const int64_t n = layer.num_tokens;
    spans[l].begin = values.size();
    spans[l].budget = layer.num_heads * (layer.budget.kept_per_head - p.sink - p.recent);
    for (int64_t h = 0; h < layer.num_heads; ++h) {
      for (int64_t j = p.sink; j < n - p.recent; ++j) values.push_back(layer.scores[h * n + j]);
    }
    if (plan->normalize) {
      NormalizeLaProxLayer(values.data() + spans[l].begin,
                           static_cast<int64_t>(values.size() - spans[l].begin));
    }
  }
  // Which candidates are kept: a top-K of (value desc, position asc) over a range.
  std::vector<uint8_t> keep(values.size(), 0);
  auto select_range = [&](size_t begin, size_t end, int64_t count) {
    count = std::clamp<int64_t>(count, 0, static_cast<int64_t>(end - begin));
    if (count == 0) return;
    const float threshold = KthLargest(values.data() + begin, end - begin, count);
    int64_t above = 0;
    for (size_t i = begin; i < end; ++i) above += values[i] > threshold;
    int64_t ties = count - above;
    for (size_t i = begin; i < end; ++i) {
      if (values[i] > threshold) {
        keep[i] = 1;
      } else if (values[i] == threshold && ties > 0) {
        keep[i] = 1;
        --ties;
      }
    }
  };
  if (plan->scope == LaProxScope::kHead) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerScores& layer = layers[l];
      const int64_t per_head = layer.num_heads ? spans[l].budget / layer.num_heads : 0;
      const size_t width = layer.num_heads
                               ? (layer.num_tokens - layer.budget.protection.sink -
                                  layer.budget.protection.recent)
                               : 0;
      for (int64_t h = 0; h < layer.num_heads; ++h) {
        const size_t begin = spans[l].begin + static_cast<size_t>(h) * width;
        select_range(begin, begin + width, per_head);
      }
    }
  } else if (plan->scope == LaProxScope::kLayer) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const size_t end = l + 1 < layers.size() ? spans[l + 1].begin : values.size();
      select_range(spans[l].begin, end, spans[l].budget);
    }
  } else {  // model, model_raw
    int64_t total = 0;
    for (const Span& s : spans) total += s.budget;
    select_range(0, values.size(), total);
  }
  // Decisions: protected tokens plus the kept candidates, ascending per head.
  std::vector<LayerDecision> out(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerScores& layer = layers[l];
    const Protection& p = layer.budget.protection;
    const int64_t n = layer.num_tokens;
    StartDecision(layer, policy.settings.output_shape, &out[l]);
    size_t i = spans[l].begin;
    std::vector<int32_t> list;
    for (int64_t h = 0; h < layer.num_heads; ++h) {
      list.clear();
      for (int64_t j = 0; j < n; ++j) {
        const bool guarded = j < p.sink || j >= n - p.recent;
        if (guarded) {
          list.push_back(static_cast<int32_t>(j));
        } else if (keep[i++]) {
          list.push_back(static_cast<int32_t>(j));
        }
      }
      AppendList(list, &out[l]);
      out[l].kept_per_head[h] = static_cast<int32_t>(list.size());
    }
  }
  return out;
}

}  // namespace kvtrim
