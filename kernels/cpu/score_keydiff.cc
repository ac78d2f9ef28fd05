// KeyDiff scorer (specs/keydiff.md §2.2): -cos(k_i, anchor), anchor = mean (unit) key.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/keydiff_block.h"
#include "kernels/cpu/scorers.h"

namespace kvtrim {

absl::StatusOr<KeyDiffAnchor> ParseKeyDiffAnchor(std::string_view text) {
  if (text == "normalized_mean") return KeyDiffAnchor::kNormalizedMean;
  if (text == "raw_mean") return KeyDiffAnchor::kRawMean;
  return absl::InvalidArgumentError(absl::StrCat("keydiff anchor '", std::string(text),
                                                 "' is not one of {normalized_mean, raw_mean}"));
}

void KeyDiffHeadScores(const float* keys, int64_t n, int64_t d, KeyDiffAnchor anchor, float eps,
                       float* norms, float* scores) {
  if (n <= 0) return;
  // Pass 1: norms [n] and the anchor sum [d] (double, rows in order 0..n-1).
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * d;  // [d]
    float sum_sq = 0.0f;
    for (int64_t c = 0; c < d; ++c) sum_sq += k[c] * k[c];
    const float nrm = std::sqrt(sum_sq);
    norms[i] = nrm;
    if (anchor == KeyDiffAnchor::kRawMean) {
      for (int64_t c = 0; c < d; ++c) sum[c] += static_cast<double>(k[c]);
    } else if (nrm > 0.0f) {
      for (int64_t c = 0; c < d; ++c) sum[c] += static_cast<double>(k[c] / nrm);
    }
  }
  std::vector<float> a(static_cast<size_t>(d));  // [d] anchor, fp32
  float an_sq = 0.0f;
  for (int64_t c = 0; c < d; ++c) {
    a[c] = static_cast<float>(sum[c] / static_cast<double>(n));
    an_sq += a[c] * a[c];
  }
  const float an = std::sqrt(an_sq);
  // Pass 2: cosine of every key with the anchor; the score is its negation.
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * d;
    float dot = 0.0f;
    for (int64_t c = 0; c < d; ++c) dot += k[c] * a[c];
    const float denom = std::max(norms[i] * an, eps);
    // denom is 0 only with eps = 0 and a zero key or anchor: the cosine is undefined; 0.
    scores[i] = denom > 0.0f ? -(dot / denom) : 0.0f;
  }
}

// Reads the `anchor` and `eps` parameters (recent_fraction and block_size are protection
// and validation concerns handled by the backend) and scores every KV head on its own.
absl::Status ScoreKeyDiff(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                          float* scores) {
  if (!params.Has("anchor") || !params.Has("eps")) {
    return absl::InternalError("keydiff: parameters 'anchor' and 'eps' must be declared");
  }
  absl::StatusOr<KeyDiffAnchor> anchor = ParseKeyDiffAnchor(params.Text("anchor"));
  if (!anchor.ok()) return anchor.status();
  const float eps = static_cast<float>(params.Number("eps"));
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  pool.ParallelFor(num_heads, [&](int64_t h) {
    std::vector<float> norms(static_cast<size_t>(n));  // [n] scratch
    KeyDiffHeadScores(layer.keys.row(h, 0), n, d, *anchor, eps, norms.data(), scores + h * n);
  });
  return absl::OkStatus();
}

}  // namespace kvtrim
