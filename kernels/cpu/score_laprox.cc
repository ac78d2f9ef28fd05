// LaProx scores (laprox.md §2.1): window column L2 norm of the mean attention, avg-pooled,
// times the projected value L2 norm through the Gram matrices. Canonical definition:
// scorers.h. Selection (per head, per layer or model-wide) is DecideLaProx (decide.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast/token_rows.h"
#include "kernels/cpu/fast/value_norms.h"
#include "kernels/cpu/fast/window_columns.h"
#include "kernels/cpu/pooling.h"
#include "kernels/cpu/projected_norms.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

absl::Status ScoreLaProx(const CpuLayer& layer, const ResolvedParams& params,
                         const RegisteredModel& model, ThreadPool& pool, float* scores) {
  const WindowPooling wp = ReadWindowPooling(params);
  const int64_t window = wp.window, kernel = wp.kernel;
  const PoolKind kind = wp.pooling;
  const LaProxGqa gqa = params.Enum<LaProxGqa>("gqa");

  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t d = layer.shape.head_dim;
  const int64_t group = layer.shape.group_size();
  const int64_t prefix = n - window;
  const float fgroup = static_cast<float>(group);
  const float* head_gram = model.head_gram[layer.layer_id].data();
  const float* group_gram = model.group_gram[layer.layer_id].data();
  const bool per_head_column = gqa == LaProxGqa::kHeadBound;

  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    AttentionRowScratch scratch;
    std::vector<float> y(static_cast<size_t>(d));
    std::vector<float> col(static_cast<size_t>(prefix));
    std::vector<float> pooled(static_cast<size_t>(prefix));
    float* out = scores + h * n;
    for (int64_t j = 0; j < n; ++j) out[j] = 0.0f;
    if (prefix <= 0) return;
    if (per_head_column) {
      // mean_g ||A_q[:, j]||_2 * ||v W_O^q||_2, pooling each head's column norm.
      std::vector<float> acc(static_cast<size_t>(prefix), 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t q = h * group + g;
        std::fill(col.begin(), col.end(), 0.0f);
        for (int64_t t = w - window; t < w; ++t) {
          const AttentionRowStats row = ComputeAttentionRow(layer, q, t, nullptr, &scratch);
          const int64_t visible = std::min(row.visible, prefix);
          for (int64_t j = 0; j < visible; ++j) {
            const float p = CanonicalProb(scratch.logits[j], row.neg_max, row.inv_sum);
            col[j] = CmAdd(col[j], CmMul(p, p));
          }
        }
        for (int64_t j = 0; j < prefix; ++j) col[j] = CmSqrt(col[j]);
        Pool1D(kind, col.data(), prefix, kernel, pooled.data());
        for (int64_t j = 0; j < prefix; ++j) {
          const float norm = GramNorm(layer.values.row(h, j), head_gram + q * d * d, d, y.data());
          acc[j] = CmAdd(acc[j], CmMul(pooled[j], norm));
        }
      }
      for (int64_t j = 0; j < prefix; ++j) out[j] = CmDiv(acc[j], fgroup);
      return;
    }
    // Column norm of the group-mean attention: per row t, m_t = mean_g p; sum_t m_t^2.
    std::vector<float> rowsum(static_cast<size_t>(group * prefix));  // [G, P] p of row t
    std::fill(col.begin(), col.end(), 0.0f);
    for (int64_t t = w - window; t < w; ++t) {
      std::fill(rowsum.begin(), rowsum.end(), 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        const AttentionRowStats row = ComputeAttentionRow(layer, h * group + g, t, nullptr, &scratch);
        const int64_t visible = std::min(row.visible, prefix);
        for (int64_t j = 0; j < visible; ++j) {
          rowsum[g * prefix + j] = CanonicalProb(scratch.logits[j], row.neg_max, row.inv_sum);
        }
      }
      for (int64_t j = 0; j < prefix; ++j) {
        float s = 0.0f;
        for (int64_t g = 0; g < group; ++g) s = CmAdd(s, rowsum[g * prefix + j]);
        const float m = CmDiv(s, fgroup);
        col[j] = CmAdd(col[j], CmMul(m, m));
      }
    }
    for (int64_t j = 0; j < prefix; ++j) col[j] = CmSqrt(col[j]);
    Pool1D(kind, col.data(), prefix, kernel, pooled.data());
    for (int64_t j = 0; j < prefix; ++j) {
      const float* v = layer.values.row(h, j);
      float norm;
      if (gqa == LaProxGqa::kSummedWo) {
        norm = GramNorm(v, group_gram + h * d * d, d, y.data());
      } else {
        float s = 0.0f;
        for (int64_t g = 0; g < group; ++g) {
          s = CmAdd(s, GramNorm(v, head_gram + (h * group + g) * d * d, d, y.data()));
        }
        norm = CmDiv(s, fgroup);
      }
      out[j] = CmMul(pooled[j], norm);
    }
  });
  return absl::OkStatus();
}

absl::Status ScoreLaProxFast(const CpuLayer& layer, const ResolvedParams& params,
                             const RegisteredModel& model, ThreadPool& pool, float* scores) {
  const WindowPooling wp = ReadWindowPooling(params);
  const int64_t window = wp.window, kernel = wp.kernel;
  const PoolKind kind = wp.pooling;
  const LaProxGqa gqa = params.Enum<LaProxGqa>("gqa");
  const int64_t heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t group = layer.shape.group_size();
  const int64_t prefix = n - window;
  std::fill_n(scores, heads * n, 0.0f);
  if (prefix <= 0) {  // nothing to score; the keys still get their finiteness check
    CheckKeysRead(layer);
    return absl::OkStatus();
  }
  const float inv_group = 1.0f / static_cast<float>(group);
  const float* head_gram = model.head_gram[layer.layer_id].data();
  const bool per_head_column = gqa == LaProxGqa::kHeadBound;
  // Column statistics: per query head sum_t p^2 (head_bound), else per KV head
  // sum_t (sum_g p)^2 = G^2 sum_t m_t^2 of the group mean m_t.
  const int64_t column_rows = per_head_column ? heads * group : heads;
  std::vector<float> columns(static_cast<size_t>(column_rows * prefix));
  FastWindowColumns(layer, window, prefix,
                    per_head_column ? WindowReduction::kSquaresPerHead
                                    : WindowReduction::kGroupSumSquares,
                    pool, columns.data());
  // Norms: per query head through its Gram matrix, or per KV head through the group's.
  const bool summed_wo = gqa == LaProxGqa::kSummedWo;
  std::vector<float> norms(static_cast<size_t>((summed_wo ? heads : heads * group) * prefix));
  if (summed_wo) {
    FastGramNorms(layer, model.group_gram[layer.layer_id].data(), 1, prefix, pool, norms.data());
  } else {
    FastGramNorms(layer, head_gram, group, prefix, pool, norms.data());
  }
  pool.ParallelFor(heads, [&](int64_t h) {
    std::vector<float> col(static_cast<size_t>(prefix)), pooled(col.size());
    float* out = scores + h * n;
    if (per_head_column) {  // mean_g pool(sqrt(sum_t p^2)) * ||v W_O^q||
      std::vector<float> acc(col.size(), 0.0f);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t q = h * group + g;
        for (int64_t j = 0; j < prefix; ++j) col[j] = std::sqrt(columns[q * prefix + j]);
        Pool1D(kind, col.data(), prefix, kernel, pooled.data());
        for (int64_t j = 0; j < prefix; ++j) acc[j] += pooled[j] * norms[q * prefix + j];
      }
      for (int64_t j = 0; j < prefix; ++j) out[j] = acc[j] * inv_group;
      return;
    }
    for (int64_t j = 0; j < prefix; ++j) col[j] = std::sqrt(columns[h * prefix + j]) * inv_group;
    Pool1D(kind, col.data(), prefix, kernel, pooled.data());
    for (int64_t j = 0; j < prefix; ++j) {
      float norm = 0.0f;
      if (summed_wo) {
        norm = norms[h * prefix + j];
      } else {
        for (int64_t g = 0; g < group; ++g) norm += norms[(h * group + g) * prefix + j];
        norm *= inv_group;
      }
      out[j] = pooled[j] * norm;
    }
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
