// KeyDiff for one head (keydiff_block.h): the canonical §2.2 scores (KeyDiffHeadScores) and
// the block-wise (streaming) simulator of specs/keydiff.md §2.3.
#include "kernels/cpu/keydiff_block.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/budget.h"
#include "kernels/canonical_math.h"
#include "kernels/decide/select.h"

namespace kvtrim {

// The canonical KeyDiff definition (keydiff.md §2.2), bit for bit; the GPU backend
// (kernels/gpu/scorers/keydiff.cu) computes exactly these IEEE-754 operations, only spread
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

// Checks the arguments of RunKeyDiffBlocks.
absl::Status CheckBlockArgs(const float* keys, int64_t num_tokens, int64_t head_dim,
                            const KeyDiffBlockOptions& o) {
  if (o.budget < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keydiff block: budget must be >= 1, got ", o.budget));
  }
  if (o.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keydiff block: block_size must be >= 1, got ", o.block_size));
  }
  if (head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keydiff block: head_dim must be >= 1, got ", head_dim));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keydiff block: num_tokens must be >= 0, got ", num_tokens));
  }
  if (!(o.recent_fraction >= 0.0 && o.recent_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("keydiff block: recent_fraction must be in [0, 1], got ", o.recent_fraction));
  }
  if (!(o.eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("keydiff block: eps must be >= 0, got ", o.eps));
  }
  if (keys == nullptr && num_tokens > 0) {
    return absl::InvalidArgumentError("keydiff block: keys is null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KeyDiffBlockResult> RunKeyDiffBlocks(const float* keys, int64_t num_tokens,
                                                    int64_t head_dim,
                                                    const KeyDiffBlockOptions& options,
                                                    const KeyDiffStepObserver& observer) {
  KVTRIM_RETURN_IF_ERROR(CheckBlockArgs(keys, num_tokens, head_dim, options));
  const int64_t N = options.budget;
  const int64_t B = options.block_size;
  const int64_t d = head_dim;
  const int64_t capacity = N + B;  // the §2.3 memory bound, entries per head
  // R = round_half_up(x*N) newest entries are protected (§2.2, §7.4; specs README rule 6
  // replaces the spec's floor).
  const int64_t recent = std::clamp<int64_t>(
      RoundHalfUp(options.recent_fraction * static_cast<double>(N)), 0, N);

  // Every buffer is sized once from the bound and never grows.
  std::vector<float> cache_keys(static_cast<size_t>(capacity * d));  // [N + B, d] fp32
  std::vector<int64_t> cache_pos(static_cast<size_t>(capacity));     // [N + B] ascending
  std::vector<float> norms(static_cast<size_t>(capacity));           // [N + B] scratch
  std::vector<float> scores(static_cast<size_t>(capacity));          // [N + B] scratch
  std::vector<int32_t> keep;                                         // [N] cache rows kept
  keep.reserve(static_cast<size_t>(N));

  KeyDiffBlockResult result;
  int64_t size = 0;
  for (int64_t start = 0; start < num_tokens; start += B) {
    const int64_t len = std::min(B, num_tokens - start);
    // Append the block. The cache holds at most N entries between steps, so this never
    // exceeds N + B; the check makes the bound a hard guarantee rather than a hope.
    if (size + len > capacity) {
      return absl::InternalError(absl::StrCat("keydiff block: cache would hold ", size + len,
                                              " entries, above the bound N + B = ", capacity));
    }
    std::memcpy(cache_keys.data() + size * d, keys + start * d,
                static_cast<size_t>(len * d) * sizeof(float));
    for (int64_t t = 0; t < len; ++t) cache_pos[size + t] = start + t;
    size += len;
    assert(size <= capacity);
    result.max_cache_size = std::max(result.max_cache_size, size);
    const int64_t size_before = size;

    if (size > N) {
      // Score all entries (anchor over the whole cache), protect the newest R rows (rows are
      // in position order), keep the top N - R of the rest; SelectTopK breaks ties to the
      // lower row, i.e. the lower original position (rule 1).
      KeyDiffHeadScores(cache_keys.data(), size, d, options.anchor, options.eps, norms.data(),
                        scores.data());
      const int64_t selectable = size - recent;
      keep.clear();
      SelectTopK(scores.data(), selectable, N - recent, &keep);
      for (int64_t r = selectable; r < size; ++r) keep.push_back(static_cast<int32_t>(r));
      // Compact in place: keep is ascending and keep[t] >= t, so forward copies are safe.
      for (int64_t t = 0; t < N; ++t) {
        const int64_t row = keep[t];
        if (row == t) continue;
        std::memmove(cache_keys.data() + t * d, cache_keys.data() + row * d,
                     static_cast<size_t>(d) * sizeof(float));
        cache_pos[t] = cache_pos[row];
      }
      result.num_evicted += size - N;
      size = N;
    }
    ++result.num_steps;
    if (observer) {
      KeyDiffBlockStep step;
      step.step = result.num_steps - 1;
      step.tokens_seen = start + len;
      step.size_before = size_before;
      step.positions = cache_pos.data();
      step.size_after = size;
      observer(step);
    }
  }
  result.kept.assign(cache_pos.begin(), cache_pos.begin() + size);
  return result;
}

}  // namespace kvtrim
