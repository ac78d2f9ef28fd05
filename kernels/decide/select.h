// Selectors: from scores (protected tokens already +inf) and counts to kept indices.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim {

/// Appends to `out` the `count` highest of scores[0..n) (ties: lower index wins), in
/// ascending index order. Scores may be +inf/-inf, never NaN.
void SelectTopK(const float* scores, int64_t n, int64_t count, std::vector<int32_t>* out);

/// Writes ranking[0..n): token indices by descending score, ties to the lower index.
void RankTokens(const float* scores, int64_t n, std::vector<int32_t>* ranking);

/// Shared output: one list for all heads. Walks the heads' rankings round-robin (rank 0 of
/// head 0, 1, ..., then rank 1, ...), adding unseen tokens until the list holds `count`.
/// scores is [num_heads, n]. Appends the ascending list to `out`.
void SelectSharedRoundRobin(const float* scores, int64_t num_heads, int64_t n, int64_t count,
                            std::vector<int32_t>* out);

/// Block-aligned output: tokens grouped in blocks [b*B, min((b+1)*B, n)). Each head ranks
/// blocks by its highest token score in the block (ties: lower block); the heads' block
/// rankings are merged round-robin (like SelectSharedRoundRobin) until `num_blocks` distinct
/// blocks are chosen. Appends every token of the chosen blocks, ascending, to `out`.
void SelectBlocks(const float* scores, int64_t num_heads, int64_t n, int64_t block_size,
                  int64_t num_blocks, std::vector<int32_t>* out);

}  // namespace kvtrim
