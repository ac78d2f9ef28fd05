// CriticalKV (criticalkv.md §2): pooled window attention for stage 1 and allocation, and
// (attention + eps) * projected-value norm for stage 2. Canonical definition: scorers.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/fast/token_rows.h"
#include "kernels/cpu/fast/value_norms.h"
#include "kernels/cpu/fast/window_columns.h"
#include "kernels/cpu/pooling.h"
#include "kernels/cpu/projected_norms.h"
#include "kernels/cpu/scorers.h"
#include "kernels/cpu/window_attention.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

absl::Status ScoreCriticalKV(const CpuLayer& layer, const ResolvedParams& params,
                             const RegisteredModel& model, ThreadPool& pool, float* attention,
                             float* critical) {
  const WindowPooling wp = ReadWindowPooling(params);
  const int64_t window = wp.window, kernel = wp.kernel;
  const PoolKind kind = wp.pooling;
  const float eps = static_cast<float>(params.Number("eps"));
  const bool l1 = params.Enum<CriticalKVNorm>("norm") == CriticalKVNorm::kL1;

  const int64_t n = layer.shape.num_tokens;
  const int64_t w = layer.shape.window_rows;
  const int64_t d = layer.shape.head_dim;
  const int64_t group = layer.shape.group_size();
  const int64_t hq = layer.shape.num_query_heads;
  const int64_t prefix = n - window;  // P; tokens j >= P score 0 (protected window)
  const int64_t hidden = model.layout.hidden_size;
  const float* w_o = model.w_o[layer.layer_id].data();
  const float* gram = model.head_gram[layer.layer_id].data();
  const float fwindow = static_cast<float>(window);
  const float fgroup = static_cast<float>(group);

  pool.ParallelFor(layer.shape.num_kv_heads, [&](int64_t h) {
    AttentionRowScratch scratch;
    std::vector<float> mean(static_cast<size_t>(prefix));      // [P] one query head
    std::vector<float> pooled(static_cast<size_t>(prefix));    // [P]
    std::vector<float> att_sum(static_cast<size_t>(prefix), 0.0f);   // seq over g
    std::vector<float> norm_sum(static_cast<size_t>(prefix), 0.0f);  // seq over g
    std::vector<float> terms(static_cast<size_t>(hidden));
    std::vector<float> chunks(static_cast<size_t>(hidden / kCanonicalChunk + 1));
    std::vector<float> y(static_cast<size_t>(d));
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      std::fill(mean.begin(), mean.end(), 0.0f);
      for (int64_t t = w - window; t < w; ++t) {
        const AttentionRowStats row = ComputeAttentionRow(layer, q, t, nullptr, &scratch);
        const int64_t visible = std::min(row.visible, prefix);
        for (int64_t j = 0; j < visible; ++j) {
          mean[j] = CmAdd(mean[j], CanonicalProb(scratch.logits[j], row.neg_max, row.inv_sum));
        }
      }
      for (int64_t j = 0; j < prefix; ++j) mean[j] = CmDiv(mean[j], fwindow);
      if (prefix > 0) Pool1D(kind, mean.data(), prefix, kernel, pooled.data());
      for (int64_t j = 0; j < prefix; ++j) {
        att_sum[j] = CmAdd(att_sum[j], pooled[j]);
        const float* v = layer.values.row(h, j);
        const float norm = l1 ? ProjectedL1Norm(v, w_o, q, d, hq, hidden, terms.data(),
                                                chunks.data())
                              : GramNorm(v, gram + q * d * d, d, y.data());
        norm_sum[j] = CmAdd(norm_sum[j], norm);
      }
    }
    float* att = attention + h * n;
    float* crit = critical + h * n;
    for (int64_t j = 0; j < n; ++j) {
      if (j < prefix) {
        att[j] = CmDiv(att_sum[j], fgroup);
        crit[j] = CmMul(CmAdd(att[j], eps), CmDiv(norm_sum[j], fgroup));
      } else {
        att[j] = 0.0f;
        crit[j] = 0.0f;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status ScoreCriticalKVFast(const CpuLayer& layer, const ResolvedParams& params,
                                 const RegisteredModel& model, ThreadPool& pool, float* attention,
                                 float* critical) {
  const WindowPooling wp = ReadWindowPooling(params);
  const int64_t window = wp.window, kernel = wp.kernel;
  const PoolKind kind = wp.pooling;
  const float eps = static_cast<float>(params.Number("eps"));
  const int64_t heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t group = layer.shape.group_size();
  const int64_t prefix = n - window;  // tokens j >= P score 0 (protected window)
  std::fill_n(attention, heads * n, 0.0f);
  std::fill_n(critical, heads * n, 0.0f);
  if (prefix <= 0) {  // nothing to score; the keys still get their finiteness check
    CheckKeysRead(layer);
    return absl::OkStatus();
  }
  const int64_t hq = layer.shape.num_query_heads;
  std::vector<float> sums(static_cast<size_t>(hq * prefix));   // [H_q, P] sum_t p
  std::vector<float> norms(static_cast<size_t>(hq * prefix));  // [H_q, P] ||v W_O^q||
  FastWindowColumns(layer, window, prefix, WindowReduction::kSumPerHead, pool, sums.data());
  if (params.Enum<CriticalKVNorm>("norm") == CriticalKVNorm::kL1) {
    FastProjectedL1Norms(layer, model.w_o[layer.layer_id].data(), model.layout.hidden_size,
                         prefix, pool, norms.data());
  } else {
    FastGramNorms(layer, model.head_gram[layer.layer_id].data(), group, prefix, pool,
                  norms.data());
  }
  const float inv_window = 1.0f / static_cast<float>(window);
  const float inv_group = 1.0f / static_cast<float>(group);
  pool.ParallelFor(heads, [&](int64_t h) {
    std::vector<float> mean(static_cast<size_t>(prefix)), pooled(mean.size());
    std::vector<float> att_sum(mean.size(), 0.0f), norm_sum(mean.size(), 0.0f);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      for (int64_t j = 0; j < prefix; ++j) mean[j] = sums[q * prefix + j] * inv_window;
      Pool1D(kind, mean.data(), prefix, kernel, pooled.data());  // before the group mean
      for (int64_t j = 0; j < prefix; ++j) {
        att_sum[j] += pooled[j];
        norm_sum[j] += norms[q * prefix + j];
      }
    }
    for (int64_t j = 0; j < prefix; ++j) {
      const float att = att_sum[j] * inv_group;
      attention[h * n + j] = att;
      critical[h * n + j] = (att + eps) * (norm_sum[j] * inv_group);
    }
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
