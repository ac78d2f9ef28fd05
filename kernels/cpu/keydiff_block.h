// KeyDiff (specs/keydiff.md) for one KV head: the §2.2 scoring shared by the KeyDiff scorer
// (kernels/cpu/scorers/keydiff.cc) and the block-wise (streaming) eviction simulator of §2.3.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "kernels/scorer_params.h"

namespace kvtrim {


/// KeyDiff §2.2 scores of one head: scores[i] = -<k_i, a> / max(||k_i|| * ||a||, eps), where
/// a is the anchor over all n rows of `keys`, in the canonical arithmetic of
/// kernels/canonical_math.h so that the GPU backend reproduces the bits: ||k_i|| =
/// CmSqrt(CmDot(k_i, k_i)); the anchor sums the fp32 key (raw_mean) or the unit key
/// CmDiv(k_i, ||k_i||) (normalized_mean; a zero key contributes zero) per dimension,
/// sequentially inside chunks of kCanonicalChunk rows, combines the chunks with CmTreeSum
/// and divides by n; ||a|| and the dots are CmDot. The step-by-step definition is in
/// keydiff_block.cc. eps >= 0; when the guarded denominator is still 0 (eps = 0 with a zero
/// key or anchor) the score is 0.
///   keys   [n, d] fp32, row-major
///   scores [n] fp32 (written)
///   norms  [n] fp32 scratch (written with ||k_i||)
void KeyDiffHeadScores(const float* keys, int64_t n, int64_t d, KeyDiffAnchor anchor, float eps,
                       float* norms, float* scores);

/// Settings of a block-wise KeyDiff run over one head (keydiff.md §2.3).
struct KeyDiffBlockOptions {
  int64_t budget = 0;        // N >= 1: entries kept after every eviction
  int64_t block_size = 128;  // B >= 1: tokens appended per step (the last block may be shorter)
  KeyDiffAnchor anchor = KeyDiffAnchor::kNormalizedMean;
  double recent_fraction = 0;  // x in [0, 1]: the round(x*N) (half up) newest are never evicted
  float eps = 1e-8f;           // cosine denominator guard, >= 0
};

/// The state after one step (one appended block and its eviction, if any).
struct KeyDiffBlockStep {
  int64_t step = 0;                    // 0-based block index
  int64_t tokens_seen = 0;             // positions [0, tokens_seen) have been appended so far
  int64_t size_before = 0;             // cache size right after the append (<= N + B)
  const int64_t* positions = nullptr;  // [size_after] cache positions, ascending
  int64_t size_after = 0;              // cache size after the eviction: min(N, tokens_seen)
};

/// The outcome of a block-wise run.
struct KeyDiffBlockResult {
  std::vector<int64_t> kept;   // [min(N, T)] original positions kept at the end, ascending
  int64_t max_cache_size = 0;  // the most entries the cache ever held (<= N + B)
  int64_t num_steps = 0;       // ceil(T / B)
  int64_t num_evicted = 0;     // total entries evicted over the run
};

/// Called after every step; the step's `positions` pointer is valid only during the call.
using KeyDiffStepObserver = std::function<void(const KeyDiffBlockStep&)>;

/// Simulates keydiff.md §2.3 on one head: the cache starts empty; for each block of B
/// consecutive tokens it appends the block's keys, and if the cache then holds more than N
/// entries it scores all of them with KeyDiffHeadScores (anchor over the whole cache),
/// protects the R = round_half_up(x*N) newest entries (§7.4, rule 6) and keeps the N - R others with the
/// highest score, equal scores keeping the lower original position (specs/README.md rule
/// 1). It never holds more than N + B keys (checked on every append; a violation is
/// INTERNAL). Errors: INVALID_ARGUMENT for N < 1, B < 1, d < 1, T < 0, x outside [0, 1],
/// eps < 0 or NaN, or a null `keys` with T > 0.
///   keys [T, d] fp32, row-major: the keys of positions 0..T-1 of one head
absl::StatusOr<KeyDiffBlockResult> RunKeyDiffBlocks(const float* keys, int64_t num_tokens,
                                                    int64_t head_dim,
                                                    const KeyDiffBlockOptions& options,
                                                    const KeyDiffStepObserver& observer = {});

}  // namespace kvtrim
