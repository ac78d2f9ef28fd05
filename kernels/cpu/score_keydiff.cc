// KeyDiff scorer (specs/keydiff.md §2.2): -cos(k_i, anchor), anchor = mean (unit) key.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/canonical_math.h"
#include "kernels/cpu/fast/key_scores.h"
#include "kernels/cpu/keydiff_block.h"
#include "kernels/cpu/scorers.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

// The canonical KeyDiff definition (keydiff.md §2.2), bit for bit; the GPU backend
// (kernels/gpu/kernels/key_scorers.cu) computes exactly these IEEE-754 operations, only spread
// over threads. Every operation is a canonical_math.h one (never fused), in this order:
//   1. nrm_i = CmSqrt(CmDot(k_i, k_i, d))                       for every row i in [0, n)
//   2. u_i[c] = k_i[c]                                            (raw_mean)
//             = nrm_i > 0 ? CmDiv(k_i[c], nrm_i) : 0              (normalized_mean)
//   3. chunk sums: the rows are cut into chunks of kCanonicalChunk = 64 consecutive rows
//      (the last one may be shorter); for chunk m and dimension c,
//        P[m][c] = (((0 + u_{64m}[c]) + u_{64m+1}[c]) + ...)   CmAdd, rows in increasing order
//   4. S[c] = CmTreeSum(P[0..M)[c]) over the M = ceil(n / 64) chunks (the fixed pairwise
//      tree; equal to the aligned power-of-two tree with absent leaves passed through)
//   5. a[c] = CmDiv(S[c], float(n))                              the anchor (n < 2^24: exact)
//   6. an = CmSqrt(CmDot(a, a, d))
//   7. dot_i = CmDot(k_i, a, d); p_i = CmMul(nrm_i, an); den_i = p_i < eps ? eps : p_i
//   8. score_i = den_i > 0 ? -CmDiv(dot_i, den_i) : 0           (negation is exact)
// A zero key contributes 0 to the normalized anchor; den_i is 0 only with eps = 0 and a zero
// key or anchor, where the cosine is undefined and the score is 0.
void KeyDiffHeadScores(const float* keys, int64_t n, int64_t d, KeyDiffAnchor anchor, float eps,
                       float* norms, float* scores) {
  if (n <= 0) return;
  const int dim = static_cast<int>(d);
  // Step 1: norms [n].
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * d;  // [d]
    norms[i] = CmSqrt(CmDot(k, k, dim));
  }
  // Steps 2-3: chunk sums P [M, d], each a sequential fp32 sum over at most 64 rows.
  const int64_t num_chunks = (n + kCanonicalChunk - 1) / kCanonicalChunk;
  std::vector<float> partial(static_cast<size_t>(num_chunks * d), 0.0f);  // [M, d]
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * d;
    float* p = partial.data() + (i / kCanonicalChunk) * d;  // [d] row of chunk i / 64
    if (anchor == KeyDiffAnchor::kRawMean) {
      for (int64_t c = 0; c < d; ++c) p[c] = CmAdd(p[c], k[c]);
    } else {
      const float nrm = norms[i];
      for (int64_t c = 0; c < d; ++c) p[c] = CmAdd(p[c], nrm > 0.0f ? CmDiv(k[c], nrm) : 0.0f);
    }
  }
  // Steps 4-6: the anchor [d] and its norm.
  std::vector<float> column(static_cast<size_t>(num_chunks));  // [M] scratch for the tree
  std::vector<float> a(static_cast<size_t>(d));                // [d] anchor
  const float count = static_cast<float>(n);
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t m = 0; m < num_chunks; ++m) column[m] = partial[m * d + c];
    a[c] = CmDiv(CmTreeSum(column.data(), num_chunks), count);
  }
  const float an = CmSqrt(CmDot(a.data(), a.data(), dim));
  // Steps 7-8: cosine of every key with the anchor; the score is its negation.
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * d;
    const float dot = CmDot(k, a.data(), dim);
    const float prod = CmMul(norms[i], an);
    const float denom = prod < eps ? eps : prod;
    scores[i] = denom > 0.0f ? -CmDiv(dot, denom) : 0.0f;
  }
}

namespace {

/// The `anchor` and `eps` parameters (recent_fraction and block_size are protection and
/// validation concerns handled by the backend).
struct KeyDiffParams {
  KeyDiffAnchor anchor = KeyDiffAnchor::kNormalizedMean;
  float eps = 0;
};

absl::StatusOr<KeyDiffParams> ReadKeyDiffParams(const ResolvedParams& params) {
  if (!params.Has("anchor") || !params.Has("eps")) {
    return absl::InternalError("keydiff: parameters 'anchor' and 'eps' must be declared");
  }
  return KeyDiffParams{params.Enum<KeyDiffAnchor>("anchor"),
                       static_cast<float>(params.Number("eps"))};
}

}  // namespace

// Scores every KV head on its own, canonically.
absl::Status ScoreKeyDiff(const CpuLayer& layer, const ResolvedParams& params, ThreadPool& pool,
                          float* scores) {
  absl::StatusOr<KeyDiffParams> read = ReadKeyDiffParams(params);
  if (!read.ok()) return read.status();
  const int64_t num_heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  pool.ParallelFor(num_heads, [&](int64_t h) {
    std::vector<float> norms(static_cast<size_t>(n));  // [n] scratch
    KeyDiffHeadScores(layer.keys.row(h, 0), n, d, read->anchor, read->eps, norms.data(),
                      scores + h * n);
  });
  return absl::OkStatus();
}

absl::Status ScoreKeyDiffFast(const CpuLayer& layer, const ResolvedParams& params,
                              ThreadPool& pool, float* scores) {
  absl::StatusOr<KeyDiffParams> read = ReadKeyDiffParams(params);
  if (!read.ok()) return read.status();
  FastKeyDiffScores(layer, read->anchor, read->eps, pool, scores);
  return absl::OkStatus();
}

}  // namespace kvtrim
