// Launchers of the device decisions (device_decide.cu): the steps of DecideLayer and
// DecideLaProx (kernels/decide/decide.h) that the selection launchers of launchers.h do not cover,
// over scores already in device memory, bit-identical to the host code.
//   per layer   per-head protection (lukv's per-head clamps of rule 3), CriticalKV's stage-1
//               counts and its stage-1 tokens forced to +inf, BLOCK_ALIGNED's block maxima and
//               the expansion of the chosen blocks into tokens;
//   LaProx      the layer normalisation of mode model (canonical chunked sum, CmDiv) and one
//               segmented top-K over candidate lists: per head (local, EQUAL_COUNT), per layer
//               (layer) or over every layer and head at once (model, model_raw).
// As in launchers.h: every launcher takes an explicit stream and device scratch sized by its
// *ScratchBytes query, returns cudaError_t and never allocates. No floating-point atomics:
// the only atomics add integers (histogram counts).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvtrim::gpu {

// ---- Steps of DecideLayer ----------------------------------------------------------------------

/// Per-head protection: sets scores [H, n] (device fp32, row-major) to +inf at tokens
/// j < sink[h] and j >= n - recent[h] of each head h. sink, recent: [H] device int64, clamped
/// by rule 3 (0 <= sink[h], 0 <= recent[h], sink[h] + recent[h] <= n). `max_protected` is at
/// least every max(sink[h], recent[h]) (it sizes the grid). Errors: cudaErrorInvalidValue for
/// H outside [0, 65535], n < 0, max_protected < 0 or null pointers (H > 0, max_protected > 0).
cudaError_t LaunchProtectHeads(float* scores, int32_t num_heads, int64_t n, const int64_t* sink,
                               const int64_t* recent, int64_t max_protected, cudaStream_t stream);

/// CriticalKV's stage-1 counts (DecideLayer): with g = sink[h] + recent[h] and
/// b = max(0, counts[h] - g), stage1[h] = min(n, g + min(b, floor(alpha * b + 0.5))) in
/// double, each operation rounded as on the host (no fused multiply-add). counts, sink,
/// recent, stage1: [H] device int64. Errors: cudaErrorInvalidValue for H outside [0, 65535],
/// n < 0 or null pointers (H > 0).
cudaError_t LaunchStageOneCounts(const int64_t* counts, const int64_t* sink, const int64_t* recent,
                                 int32_t num_heads, int64_t n, double alpha, int64_t* stage1,
                                 cudaStream_t stream);

/// Sets scores [H, n] (device fp32) to +inf at the tokens of per-head CSR lists: for each head
/// h, scores[h * n + indices[i]] for i in [offsets[h], offsets[h + 1]). offsets: [H + 1] device
/// int64; indices: device int32 in [0, n). `max_list` is at least the longest list (it sizes the
/// grid). Errors: cudaErrorInvalidValue for H outside [0, 65535], n < 0, max_list < 0 or null
/// pointers (H > 0, max_list > 0).
cudaError_t LaunchForceKeep(float* scores, int32_t num_heads, int64_t n, const int64_t* offsets,
                            const int32_t* indices, int64_t max_list, cudaStream_t stream);

/// BLOCK_ALIGNED block scores (SelectBlocks): block_scores [H, B] (device fp32, B = ceil(n /
/// block)) = the largest score of each head in tokens [b * block, min((b + 1) * block, n)),
/// taken left to right as std::max does from -inf. Errors: cudaErrorInvalidValue for H outside
/// [0, 65535], n < 0, block < 1 or null pointers (H > 0, n > 0).
cudaError_t LaunchBlockMax(const float* scores, int32_t num_heads, int64_t n, int64_t block,
                           float* block_scores, cudaStream_t stream);

/// BLOCK_ALIGNED answer from the chosen blocks: chosen [count] (device int32, ascending, block
/// indices below ceil(n / block)), count >= 1. Writes every token of the chosen blocks, ascending,
/// to indices (device int32, capacity count * block) and offsets [2] (device int64) = {0, tokens}
/// (only the last block, ceil(n / block) - 1, may be partial, so the tokens of the r-th chosen
/// block start at r * block). Errors: cudaErrorInvalidValue for count < 1, block < 1, n < 1 or
/// null pointers.
cudaError_t LaunchExpandBlocks(const int32_t* chosen, int64_t count, int64_t block, int64_t n,
                               int32_t* indices, int64_t* offsets, cudaStream_t stream);

// ---- LaProx: layer normalisation -------------------------------------------------------------

/// Device scratch bytes of LaunchNormalizeCandidates over `count` candidates.
size_t NormalizeCandidatesScratchBytes(int64_t count);

/// LaProx mode model's layer normalisation (NormalizeLaProxLayer) in place: values [rows,
/// pitch] (device fp32) hold the layer's candidates in columns [0, width) of each row, in
/// (row, column) order; z = CmChunkedSum over the rows * width candidates in that order
/// (chunks of 64 crossing rows, then the pairwise tree), then v = CmDiv(v, z), or 0 when z is
/// not positive. Three launches (chunk sums, the tree, the division). Errors:
/// cudaErrorInvalidValue for rows outside [0, 65535], width < 0, pitch < width, a null values
/// pointer (rows * width > 0) or scratch below NormalizeCandidatesScratchBytes.
cudaError_t LaunchNormalizeCandidates(float* values, int32_t rows, int64_t width, int64_t pitch,
                                      void* scratch, size_t scratch_bytes, cudaStream_t stream);

// ---- LaProx: segmented top-K over candidate lists ----------------------------------------------

/// Candidates per tile of LaunchSelectCandidates (one CTA reads one tile per pass).
inline constexpr int64_t kCandidateTile = 8192;

/// One (layer, KV head) of a candidate list: its unprotected tokens sink .. sink + width - 1,
/// whose scores values[0 .. width) compete in the head's segment. The head's answer is its sink
/// tokens, its kept candidates and its `recent` last tokens (n = sink + width + recent), ascending.
struct CandidateHead {
  const float* values = nullptr;  // [width] device fp32 (may be null when width is 0)
  int64_t width = 0;
  int64_t sink = 0;
  int64_t recent = 0;
  int64_t protected_before = 0;   // sum of sink + recent over the heads before this one
  int32_t segment = 0;            // the top-K the head's candidates take part in
  int32_t first_tile = 0;         // its first tile, or (no tile) the next head's, or num_tiles
};

/// Up to kCandidateTile consecutive candidates of one head: [begin, min(begin + kCandidateTile,
/// width)). Tiles are ordered by (head, begin); the heads of a segment are consecutive.
struct CandidateTile {
  int32_t head = 0;
  int64_t begin = 0;
};

/// One top-K: `keep` candidates of its heads (clamped to their candidate count by the caller)
/// by score, higher first, ties to the earlier (head, token).
struct CandidateSegment {
  int64_t keep = 0;
  int32_t first_tile = 0;         // the first tile of its first head that has one
};

/// Device scratch bytes of LaunchSelectCandidates.
size_t SelectCandidatesScratchBytes(int32_t num_heads, int32_t num_tiles, int32_t num_segments);

/// The segmented top-K of DecideLaProx over device tables (heads [G], tiles [T], segments [S],
/// device memory): in each segment the `keep` highest candidates by (score descending, head,
/// token) with -0.0 == +0.0, exactly as DecideLaProx's KthLargest and its float comparisons.
/// Writes head_start [G + 1] (device int64: head g's list is indices[head_start[g] ..
/// head_start[g + 1]); head_start[0] = 0, head_start[G] = protected_total + sum of the keeps)
/// and indices (device int32, capacity head_start[G]): per head its sink tokens, kept tokens
/// and recent tokens, ascending. protected_total = sum of sink + recent over the heads. Four
/// 8-bit radix passes (histograms per CTA, added into the segment's with integer atomics), a
/// count pass, one CTA that scans the tiles, and the writes: 12 launches, each reading the
/// candidates once at most. Scores must not be NaN. Errors: cudaErrorInvalidValue for
/// negative sizes, null tables or outputs, or scratch below SelectCandidatesScratchBytes.
cudaError_t LaunchSelectCandidates(const CandidateHead* heads, int32_t num_heads,
                                   const CandidateTile* tiles, int32_t num_tiles,
                                   const CandidateSegment* segments, int32_t num_segments,
                                   int64_t protected_total, int64_t* head_start, int32_t* indices,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace kvtrim::gpu
