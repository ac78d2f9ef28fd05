// Expected Attention (baselines.md §7): attention expected under Gaussian future queries.
// Canonical definition: scorers.h; statistics: expected_attention_stats.h.
#include <limits>
#include <vector>

#include "kernels/canonical_math.h"
#include "kernels/cpu/fast/expected_attention.h"
#include "kernels/cpu/scorers.h"
#include "kernels/expected_attention_stats.h"

namespace kvtrim {

/// Scores from prepared statistics (exposed for tests through ScoreExpectedAttention).
static void ScoreFromStats(const CpuLayer& layer, const ExpectedQueryStats& stats, float eps,
                           bool use_vnorm, ThreadPool& pool, float* scores) {
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  const int64_t hkv = layer.shape.num_kv_heads;
  const int64_t group = stats.mean.size() / static_cast<size_t>(d) / static_cast<size_t>(hkv);
  const float scale = layer.softmax_scale;
  const float fgroup = static_cast<float>(group);
  pool.ParallelFor(hkv, [&](int64_t h) {
    std::vector<float> logits(static_cast<size_t>(n));
    std::vector<float> acc(static_cast<size_t>(n), 0.0f);
    std::vector<float> chunks(static_cast<size_t>(n / kCanonicalChunk + 1));
    std::vector<float> y(static_cast<size_t>(d));
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      const float* mu = stats.mean.data() + q * d;
      const float* sigma = stats.cov.data() + q * d * d;
      float max_logit = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        const float* k = layer.keys.row(h, j);
        const float lin = CmDot(mu, k, static_cast<int>(d));
        for (int64_t i = 0; i < d; ++i) y[i] = CmDot(sigma + i * d, k, static_cast<int>(d));
        const float quad = CmDot(k, y.data(), static_cast<int>(d));
        logits[j] = CmAdd(CmMul(lin, scale), CmMul(quad, stats.half_scale2));
        if (logits[j] > max_logit) max_logit = logits[j];
      }
      for (int64_t j = 0; j < n; ++j) logits[j] = CmExp(CmAdd(logits[j], -max_logit));
      const float inv = CmDiv(1.0f, CmChunkedSum(logits.data(), n, chunks.data()));
      for (int64_t j = 0; j < n; ++j) acc[j] = CmAdd(acc[j], CmMul(logits[j], inv));
    }
    float* out = scores + h * n;
    for (int64_t j = 0; j < n; ++j) {
      const float ea = CmAdd(CmDiv(acc[j], fgroup), eps);
      if (use_vnorm) {
        const float* v = layer.values.row(h, j);
        out[j] = CmMul(ea, CmSqrt(CmDot(v, v, static_cast<int>(d))));
      } else {
        out[j] = ea;
      }
    }
  });
}

namespace {

/// The query statistics of `layer` from the model or the window (params "query_stats").
absl::StatusOr<ExpectedQueryStats> StatsFor(const CpuLayer& layer, const ResolvedParams& params,
                                            const RegisteredModel& model) {
  TensorView queries;
  if (layer.shape.has_queries) {
    queries.data = layer.queries.data();
    queries.dtype = DType::kF32;
    queries.shape = layer.queries.shape();
  }
  return ComputeExpectedQueryStats(model, params, layer.layer_id, layer.shape.num_tokens,
                                   queries, layer.softmax_scale);
}

}  // namespace

absl::Status ScoreExpectedAttention(const CpuLayer& layer, const ResolvedParams& params,
                                    const RegisteredModel& model, ThreadPool& pool,
                                    float* scores) {
  auto stats = StatsFor(layer, params, model);
  if (!stats.ok()) return stats.status();
  ScoreFromStats(layer, *stats, static_cast<float>(params.Number("eps")), params.Bool("use_vnorm"),
                 pool, scores);
  return absl::OkStatus();
}

absl::Status ScoreExpectedAttentionFast(const CpuLayer& layer, const ResolvedParams& params,
                                        const RegisteredModel& model, ThreadPool& pool,
                                        float* scores) {
  auto stats = StatsFor(layer, params, model);
  if (!stats.ok()) return stats.status();
  FastExpectedAttentionScores(layer, *stats, static_cast<float>(params.Number("eps")),
                              params.Bool("use_vnorm"), pool, scores);
  return absl::OkStatus();
}

}  // namespace kvtrim
