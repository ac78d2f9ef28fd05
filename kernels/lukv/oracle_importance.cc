#include "kernels/lukv/oracle_importance.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/thread_pool.h"

namespace kvtrim::lukv {

absl::StatusOr<GqaAggregation> ParseGqaAggregation(absl::string_view text) {
  if (text == "mean") return GqaAggregation::kMean;
  if (text == "sum") return GqaAggregation::kSum;
  if (text == "max") return GqaAggregation::kMax;
  return absl::InvalidArgumentError(
      absl::StrCat("gqa_agg must be mean, sum or max, got \"", text, "\""));
}

const char* GqaAggregationName(GqaAggregation agg) {
  switch (agg) {
    case GqaAggregation::kMean: return "mean";
    case GqaAggregation::kSum: return "sum";
    case GqaAggregation::kMax: return "max";
  }
  return "mean";
}

namespace {

/// ‖v_{h,j} W_O^{(g)}‖₂ for j < T through the Gram matrix W_O^{(g)} W_O^{(g)ᵀ} [d, d]:
/// norms [T].
std::vector<double> ProjectedNorms(const F32Tensor& values, const F32Tensor& w_o, int64_t g,
                                   int64_t h, const CalibrationDims& dims) {
  const int64_t d = dims.head_dim, D = w_o.dim(1), cols = w_o.dim(2), T = dims.context_length;
  std::vector<double> gram(static_cast<size_t>(d * d), 0.0);
  for (int64_t e = 0; e < D; ++e) {
    const float* row = w_o.data() + e * cols + g * d;
    for (int64_t a = 0; a < d; ++a) {
      for (int64_t b = 0; b < d; ++b) gram[a * d + b] += double{row[a]} * double{row[b]};
    }
  }
  std::vector<double> norms(static_cast<size_t>(T));
  for (int64_t j = 0; j < T; ++j) {
    const float* v = values.row(h, j);
    double sq = 0;
    for (int64_t a = 0; a < d; ++a) {
      double inner = 0;
      for (int64_t b = 0; b < d; ++b) inner += gram[a * d + b] * double{v[b]};
      sq += double{v[a]} * inner;
    }
    norms[j] = std::sqrt(std::max(sq, 0.0));
  }
  return norms;
}

/// Softmax weights of query row p of head g over keys 0..p of KV head h: attn [p + 1].
void AttentionRow(const F32Tensor& keys, const F32Tensor& queries, int64_t g, int64_t h,
                  int64_t p, int64_t d, double scale, std::vector<double>* attn) {
  attn->resize(static_cast<size_t>(p + 1));
  const float* q = queries.row(g, p);
  double peak = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j <= p; ++j) {
    const float* k = keys.row(h, j);
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += double{q[c]} * double{k[c]};
    (*attn)[j] = dot * scale;
    peak = std::max(peak, (*attn)[j]);
  }
  double total = 0;
  for (double& x : *attn) {
    x = std::exp(x - peak);
    total += x;
  }
  for (double& x : *attn) x /= total;
}

}  // namespace

std::vector<double> OracleImportance(const F32Tensor& keys, const F32Tensor& values,
                                     const F32Tensor& queries, const F32Tensor& w_o,
                                     const CalibrationDims& dims, float softmax_scale,
                                     const OracleOptions& options, ThreadPool* pool) {
  const int64_t hkv = dims.num_kv_heads, G = dims.group_size(), d = dims.head_dim;
  const int64_t T = dims.context_length, S = dims.decode_start;
  const int64_t end = std::min(dims.num_tokens, S + std::max<int64_t>(options.k_max, 0));
  const double scale = softmax_scale > 0 ? double{softmax_scale}
                                         : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> importance(static_cast<size_t>(hkv * T), 0.0);
  auto head = [&](int64_t h) {
    std::vector<std::vector<double>> norms(static_cast<size_t>(G));
    for (int64_t i = 0; i < G; ++i) norms[i] = ProjectedNorms(values, w_o, h * G + i, h, dims);
    std::vector<double> attn, step(static_cast<size_t>(T));
    double* out = importance.data() + h * T;
    for (int64_t p = S; p < end; ++p) {
      std::fill(step.begin(), step.end(), 0.0);
      for (int64_t i = 0; i < G; ++i) {
        AttentionRow(keys, queries, h * G + i, h, p, d, scale, &attn);
        for (int64_t j = 0; j < T; ++j) {
          const double c = attn[j] * norms[i][j];
          step[j] = options.gqa == GqaAggregation::kMax ? std::max(step[j], c) : step[j] + c;
        }
      }
      const double div = options.gqa == GqaAggregation::kMean ? static_cast<double>(G) : 1.0;
      for (int64_t j = 0; j < T; ++j) out[j] = std::max(out[j], step[j] / div);
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(hkv, head);
  } else {
    for (int64_t h = 0; h < hkv; ++h) head(h);
  }
  return importance;
}

void NormaliseLayer(std::vector<double>* importance) {
  double total = 0;
  for (double x : *importance) total += x;
  if (!(total > 0)) return;
  for (double& x : *importance) x /= total;
}

}  // namespace kvtrim::lukv
