// What the fast CPU kernels (kernels/cpu/fast/) share: the key tile, the slab limit, the
// plain-C++ steps around the SIMD code, and the run-time instruction-set choice with its
// test hooks. The SIMD code itself is in tile_ops-inl.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim {

/// Tokens per key tile of the fast passes.
constexpr int64_t kFastTokenTile = 256;

/// Rows of one slab (a block of window rows whose logits over every token are kept): a
/// multiple of every target's two vectors.
constexpr int64_t kSlabRows = 32;

/// Largest per-thread slab of kSlabRows rows' logits over every token of a head (default
/// 8 MiB: n <= 64K); longer layers recompute the logits in each pass.
int64_t MaxSlabBytes();

/// Number of key tiles of n tokens.
inline int64_t KeyTiles(int64_t n) { return (n + kFastTokenTile - 1) / kFastTokenTile; }

/// The tokens of the tile at j0 (count tokens) that rows [r0, r0 + rows) see, as floats:
/// clamp(visible[r0 + r] - j0, 0, count).
void SeenRows(const std::vector<int64_t>& visible, int64_t r0, int64_t rows, int64_t j0,
              int64_t count, float* seen /*[rows]*/);

/// Each row's -M and 1 / Z from its per-tile maxima and sums [tiles, stride] (row r at
/// offset r), the tiles combined in order (Z in fp64); 0 and 0 for rows that see nothing.
void CombineTiles(const float* tile_max, const float* tile_sum, int64_t tiles, int64_t stride,
                  int64_t rows, float* neg_max /*[rows]*/, float* inv_sum /*[rows]*/);

/// Per tile t and row r, the factor turning the tile's exp(l - m_t) into probabilities:
/// exp(m_t - M) / Z, with M = -neg_max[r] and 1 / Z = inv_sum[r] from CombineTiles (0 for a
/// tile the row sees nothing of). factors [tiles, stride], tile stats as CombineTiles reads.
void TileFactors(const float* tile_max, const float* tile_sum, int64_t tiles, int64_t stride,
                 int64_t rows, const float* neg_max, const float* inv_sum, float* factors);

/// The instruction set the fast CPU kernels run on now ("AVX3" = AVX-512, "AVX2", "SSE4",
/// "SSSE3", "SCALAR" = no SIMD), as Highway names it.
std::string FastCpuTarget();

/// Which instruction sets the fast CPU kernels may use (tests force the lower ones).
enum class CpuSimdLimit {
  kBest,   // the best the CPU has
  kAvx2,   // AVX2 at most
  kScalar  // no SIMD: Highway's scalar code (one lane)
};

/// Limits the fast CPU kernels to `limit` for the whole process (tests only; not
/// thread-safe against running kernels).
void SetCpuSimdLimitForTest(CpuSimdLimit limit);

/// Sets the largest per-thread slab (default 8 MiB); 0 forces the paths that recompute the
/// logits (tests only).
void SetCpuSlabBytesForTest(int64_t bytes);

}  // namespace kvtrim
