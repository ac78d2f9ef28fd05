#include "kernels/cpu/window_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvtrim {

float DotF32(const float* a, const float* b, int64_t d) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    for (int l = 0; l < 8; ++l) part[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < d; ++i, ++l) part[l] += a[i] * b[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

int64_t VisibleTokens(const CpuLayer& layer, int64_t t) {
  return std::clamp<int64_t>(layer.QueryPosition(t) + 1, 0, layer.shape.num_tokens);
}

absl::Status CheckQueryWindow(const char* scorer, const CpuLayer& layer, int64_t window) {
  if (!layer.shape.has_queries || !layer.queries.present() || layer.shape.group_size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(scorer, ": needs queries"));
  }
  if (window < 1 || window > layer.shape.window_rows) {
    return absl::InvalidArgumentError(absl::StrCat(scorer, ": window ", window,
                                                   " is outside [1, ", layer.shape.window_rows,
                                                   "] (the query rows sent)"));
  }
  return absl::OkStatus();
}

AttentionRowStats ComputeAttentionRow(const CpuLayer& layer, int64_t q_head, int64_t t,
                                      float* probs, float* output) {
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  const int64_t group = layer.shape.group_size();
  const int64_t kv_head = q_head / group;
  const float* q = layer.queries.row(q_head, t);
  const float scale = layer.softmax_scale;

  AttentionRowStats stats;
  stats.visible = VisibleTokens(layer, t);
  stats.lse = -std::numeric_limits<double>::infinity();
  std::fill(probs + stats.visible, probs + n, 0.0f);
  if (output != nullptr) std::fill(output, output + d, 0.0f);
  if (stats.visible == 0) return stats;

  // Pass 1: logits (fp32) into probs, and their maximum.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < stats.visible; ++j) {
    probs[j] = scale * DotF32(q, layer.keys.row(kv_head, j), d);
    max_logit = std::max(max_logit, probs[j]);
  }
  // Pass 2: LSE in double, in token order.
  double sum = 0;
  for (int64_t j = 0; j < stats.visible; ++j) {
    sum += std::exp(static_cast<double>(probs[j]) - static_cast<double>(max_logit));
  }
  stats.lse = static_cast<double>(max_logit) + std::log(sum);

  // Pass 3: probabilities, and the output accumulated in double.
  std::vector<double> acc(output != nullptr ? static_cast<size_t>(d) : 0, 0.0);
  for (int64_t j = 0; j < stats.visible; ++j) {
    const double p = std::exp(static_cast<double>(probs[j]) - stats.lse);
    probs[j] = static_cast<float>(p);
    if (output != nullptr) {
      const float* v = layer.values.row(kv_head, j);
      for (int64_t i = 0; i < d; ++i) acc[i] += p * static_cast<double>(v[i]);
    }
  }
  if (output != nullptr) {
    for (int64_t i = 0; i < d; ++i) output[i] = static_cast<float>(acc[i]);
  }
  return stats;
}

}  // namespace kvtrim
