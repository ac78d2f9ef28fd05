// Sort keys of the GPU selectors (select.cu): every selector ranks elements by one unsigned
// 64-bit key, smaller = ranked first, unique where the CPU's order is total. The scores
// become order-preserving 32-bit keys (descending), so radix selection on the key reproduces
// the CPU's comparisons (kernels/decide/select.cc, allocate.cc) exactly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvtrim::gpu {

/// 32-bit key of a score, ascending in rank: a higher score gets a smaller key, +inf the
/// smallest of all non-NaN scores, -inf the largest; -0.0 and +0.0 get the same key (they
/// compare equal on the CPU, so they tie and the lower index wins). Scores are never NaN.
__device__ __forceinline__ uint32_t DescendingScoreKey(float score) {
  uint32_t bits = __float_as_uint(score);
  if ((bits << 1) == 0) bits = 0;  // -0.0 -> +0.0
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

/// The state of one radix selection segment between passes.
struct SegmentState {
  unsigned long long rank;    // 1-based rank still sought among keys matching `prefix`; 0 = idle
  unsigned long long prefix;  // the bits of the sought key resolved so far (others 0)
};

/// Per-head top-k (SelectTopK): key = DescendingScoreKey << 32. Ties in the key are broken
/// by index order in the compaction, not by the key. One segment per head (row).
struct TopKKeys {
  const float* scores;  // [H, n] fp32, device
  int64_t n;
  __device__ __forceinline__ int Segment(int row) const { return row; }
  __device__ __forceinline__ bool Key(int row, int64_t j, unsigned long long* key) const {
    *key = static_cast<unsigned long long>(DescendingScoreKey(scores[row * n + j])) << 32;
    return true;
  }
};

/// AdaKV step 1 (each head's safeguard top-s): key = DescendingScoreKey << 32 | j, unique
/// within a head, so the s-th key marks the exact boundary. One segment per head (row).
struct HeadRankKeys {
  const float* scores;  // [H, n] fp32, device
  int64_t n;
  __device__ __forceinline__ int Segment(int row) const { return row; }
  __device__ __forceinline__ bool Key(int row, int64_t j, unsigned long long* key) const {
    *key = (static_cast<unsigned long long>(DescendingScoreKey(scores[row * n + j])) << 32) |
           static_cast<unsigned long long>(j);
    return true;
  }
};

/// AdaKV step 2 (the layer pool): the candidates are the tokens outside their head's
/// safeguard; key = DescendingScoreKey << 32 | j << head_bits | h, the CPU's order (higher
/// score, then lower token, then lower head). One segment for the whole layer.
struct PoolKeys {
  const float* scores;              // [H, n] fp32, device
  int64_t n;
  const SegmentState* head_state;   // [H] results of step 1 (prefix = the s-th key)
  bool has_safeguard;               // s >= 1 (otherwise every token is a candidate)
  int head_bits;                    // bits of H - 1
  __device__ __forceinline__ int Segment(int row) const { return 0; }
  __device__ __forceinline__ bool Key(int row, int64_t j, unsigned long long* key) const {
    const unsigned long long score_key =
        static_cast<unsigned long long>(DescendingScoreKey(scores[row * n + j])) << 32;
    if (has_safeguard && (score_key | static_cast<unsigned long long>(j)) <= head_state[row].prefix) {
      return false;  // inside the head's safeguard
    }
    *key = score_key | (static_cast<unsigned long long>(j) << head_bits) |
           static_cast<unsigned long long>(row);
    return true;
  }
};

/// Shared output: key[j] = min over heads of rank_h(j) * H + h (precomputed), one row.
struct TokenKeys {
  const unsigned long long* token_key;  // [n], device
  __device__ __forceinline__ int Segment(int row) const { return 0; }
  __device__ __forceinline__ bool Key(int row, int64_t j, unsigned long long* key) const {
    *key = token_key[j];
    return true;
  }
};

}  // namespace kvtrim::gpu
