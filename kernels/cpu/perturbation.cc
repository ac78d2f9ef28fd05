// Exact relative output perturbation of a kept set (perturbation.h), fp64.
#include "kernels/cpu/perturbation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/window_attention.h"

namespace kvtrim {

namespace {

// Relative perturbation ||a_kept - a_full|| / ||a_full|| of one window row (q_head, t)
// against KV head h, with kept[j] != 0 marking kept tokens. logits [n] and the two [d]
// accumulators are caller scratch. fp64 throughout.
double RowPerturbation(const CpuLayer& layer, int64_t h, int64_t q_head, int64_t t,
                       const std::vector<char>& kept, std::vector<double>& logits,
                       std::vector<double>& acc_full, std::vector<double>& acc_kept) {
  const int64_t d = layer.shape.head_dim;
  const int64_t visible = VisibleTokens(layer, t);
  const float* q = layer.queries.row(q_head, t);
  const double scale = layer.softmax_scale;
  const double neg_inf = -std::numeric_limits<double>::infinity();

  double max_full = neg_inf;
  double max_kept = neg_inf;
  for (int64_t j = 0; j < visible; ++j) {
    const float* k = layer.keys.row(h, j);
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * static_cast<double>(k[i]);
    logits[j] = scale * dot;
    max_full = std::max(max_full, logits[j]);
    if (kept[j]) max_kept = std::max(max_kept, logits[j]);
  }
  std::fill(acc_full.begin(), acc_full.end(), 0.0);
  std::fill(acc_kept.begin(), acc_kept.end(), 0.0);
  double sum_full = 0;
  double sum_kept = 0;
  for (int64_t j = 0; j < visible; ++j) {
    const float* v = layer.values.row(h, j);
    const double e_full = std::exp(logits[j] - max_full);
    sum_full += e_full;
    for (int64_t i = 0; i < d; ++i) acc_full[i] += e_full * static_cast<double>(v[i]);
    if (kept[j]) {
      // Separate max so a kept set far below the row maximum does not underflow.
      const double e_kept = std::exp(logits[j] - max_kept);
      sum_kept += e_kept;
      for (int64_t i = 0; i < d; ++i) acc_kept[i] += e_kept * static_cast<double>(v[i]);
    }
  }
  double full_sq = 0;
  double kept_sq = 0;
  double diff_sq = 0;
  for (int64_t i = 0; i < d; ++i) {
    const double a_full = sum_full > 0 ? acc_full[i] / sum_full : 0.0;
    const double a_kept = sum_kept > 0 ? acc_kept[i] / sum_kept : 0.0;
    full_sq += a_full * a_full;
    kept_sq += a_kept * a_kept;
    diff_sq += (a_kept - a_full) * (a_kept - a_full);
  }
  if (full_sq == 0) return kept_sq == 0 ? 0.0 : 1.0;
  return std::sqrt(diff_sq / full_sq);
}

}  // namespace

// Mean over the group's G query heads and all w window rows of the row perturbation.
// Rows that see no kept token have a_kept = 0 and contribute 1 (when a_full != 0).
void OutputPerturbation(const CpuLayer& layer, const std::vector<int64_t>& offsets,
                        const std::vector<int32_t>& kept, ThreadPool& pool, double* out) {
  const int64_t num_kv = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  const int64_t w = layer.shape.window_rows;
  const int64_t group = layer.shape.group_size();
  if (!layer.values.present() || !layer.queries.present() || group < 1 || w < 1 ||
      offsets.size() < 2) {
    std::fill(out, out + num_kv, 0.0);
    return;
  }
  const bool shared = offsets.size() == 2;
  pool.ParallelFor(num_kv, [&](int64_t h) {
    const int64_t list = shared ? 0 : h;
    std::vector<char> mask(n, 0);  // [n] 1 = kept
    for (int64_t i = offsets[list]; i < offsets[list + 1]; ++i) {
      const int32_t j = kept[i];
      if (j >= 0 && j < n) mask[j] = 1;
    }
    std::vector<double> logits(n);
    std::vector<double> acc_full(d);
    std::vector<double> acc_kept(d);
    double total = 0;
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = 0; t < w; ++t) {
        total += RowPerturbation(layer, h, h * group + g, t, mask, logits, acc_full, acc_kept);
      }
    }
    out[h] = total / static_cast<double>(group * w);
  });
}

}  // namespace kvtrim
