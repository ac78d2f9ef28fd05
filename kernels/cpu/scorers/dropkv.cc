// DropKV (dropkv.md §2): pooled eviction cost sum_t (p/(1-p+eps))^2 ||a_t - v_j||^2.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/fast/dropkv_cost.h"
#include "kernels/cpu/pooling.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"
#include "kernels/scorer_params.h"
#include "base/dtype.h"

namespace kvtrim {

namespace {

/// DropKV's parameters (read, not checked: the engine validated the layer against them).
struct DropKVSettings {
  int64_t window = 0, kernel = 0;
  float eps = 0;
  PoolKind pooling = PoolKind::kMax;
  bool bf16_round = false;
};

DropKVSettings ReadDropKV(const CpuLayer& layer, const ResolvedParams& params) {
  const WindowPooling wp = ReadWindowPooling(params);
  DropKVSettings out;
  out.window = wp.window;
  out.kernel = wp.kernel;
  out.pooling = wp.pooling;
  out.eps = static_cast<float>(params.Number("eps"));
  out.bf16_round =
      RoundsProbToBf16(params.Enum<Bf16ProbRound>("bf16_prob_round"), layer.input_dtype);
  return out;
}

}  // namespace

// For KV head h (canonical steps 4-6 of window_attention.h):
//   cost_j = seq_{g < G} seq_{t in last `window` rows, n-w+t >= j}
//              DropKVTerm(p~, eps, |a_{g,t}|^2, |v_j|^2, <a_{g,t}, v_j>)
//            = (p~/(1 - p~ + eps))^2 * max(0, |a|^2 + |v_j|^2 - 2<a, v_j>)
//   p~ = RoundToBf16(p) when bf16 rounding is on, else p
//   score = Pool_kernel(CmDiv(cost_j, G))   (the whole n-vector, window tokens included)
// Terms are added in (g, t) order, so the result does not depend on the thread count.
// The score is an eviction cost: higher = keep.
absl::Status ScoreDropKV(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                         float* scores) {
  const DropKVSettings settings = ReadDropKV(layer, params);
  const int64_t window = settings.window;
  const float eps = settings.eps;
  const bool bf16_round = settings.bf16_round;

  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  const int kd = static_cast<int>(d);
  const int64_t w = layer.shape.window_rows;
  const int64_t group = layer.shape.group_size();
  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    AttentionRowScratch scratch;
    std::vector<float> output(d);    // [d] a_{g,t}
    std::vector<float> vv(n);        // [n] |v_j|^2
    std::vector<float> cost(n, 0);   // [n] seq sum of the terms
    for (int64_t j = 0; j < n; ++j) {
      const float* v = layer.values.row(h, j);
      vv[j] = CmDot(v, v, kd);
    }
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = w - window; t < w; ++t) {
        const AttentionRowStats row =
            ComputeAttentionRow(layer, h * group + g, t, output.data(), &scratch);
        const float* logits = scratch.logits.data();
        const float aa = CmDot(output.data(), output.data(), kd);
        for (int64_t j = 0; j < row.visible; ++j) {
          float p = CanonicalProb(logits[j], row.neg_max, row.inv_sum);
          if (bf16_round) p = RoundToBf16(p);
          const float av = CmDot(output.data(), layer.values.row(h, j), kd);
          cost[j] = CmAdd(cost[j], DropKVTerm(p, eps, aa, vv[j], av));
        }
      }
    }
    const float group_f = static_cast<float>(group);
    for (int64_t j = 0; j < n; ++j) cost[j] = CmDiv(cost[j], group_f);
    Pool1D(settings.pooling, cost.data(), n, settings.kernel, scores + h * n);
  });
  return absl::OkStatus();
}

// Fast numerics: the cost of FastDropKVCost (fp32, SIMD), then the same group mean and
// pooling as above.
absl::Status ScoreDropKVFast(const CpuLayer& layer, const ResolvedParams& params,
                             ThreadPool& pool, float* scores) {
  return ScoreDropKVFastWithRows(layer, params, pool, scores, nullptr);
}

absl::Status ScoreDropKVFastWithRows(const CpuLayer& layer, const ResolvedParams& params,
                                     ThreadPool& pool, float* scores, FastRowOutputs* rows) {
  const DropKVSettings settings = ReadDropKV(layer, params);
  float* outputs = nullptr;
  if (rows != nullptr) {
    rows->rows_per_head = settings.window;
    rows->outputs.resize(static_cast<size_t>(layer.shape.num_query_heads * settings.window *
                                             layer.shape.head_dim));
    outputs = rows->outputs.data();
  }
  const int64_t n = layer.shape.num_tokens;
  const int64_t heads = layer.shape.num_kv_heads;
  std::vector<float> cost(static_cast<size_t>(heads * n));
  FastDropKVCost(layer, settings.window, settings.eps, settings.bf16_round, pool,
                 cost.data(), outputs);
  const float group = static_cast<float>(layer.shape.group_size());
  pool.ParallelFor(heads, [&](int64_t h) {
    float* c = cost.data() + h * n;
    for (int64_t j = 0; j < n; ++j) c[j] = CmDiv(c[j], group);
    Pool1D(settings.pooling, c, n, settings.kernel, scores + h * n);
  });
  return absl::OkStatus();
}

/// Adds the scorer to the CPU scorer table (its GPU twin: kernels/gpu/scorers/dropkv.cu).
void RegisterCpuScorer_dropkv(CpuScorerTable& table) {
  table.Register("dropkv", {&ScoreDropKV, &ScoreDropKVFast, &ScoreDropKVFastWithRows});
}

}  // namespace kvtrim
