// Fast key norms and KeyDiff scores on the CPU (key_scores.h). The SIMD steps (tile_ops-inl.h)
// are compiled once per instruction set by Highway (foreach_target re-includes this file)
// and chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/key_scores.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <cmath>
#include <vector>

#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/key_scores.h"
#include "kernels/cpu/fast/token_rows.h"

namespace kvtrim {

HWY_EXPORT(TileSquaredNorms);
HWY_EXPORT(TileAddRows);
HWY_EXPORT(TileLogitsDot);

namespace {

/// Per-thread widened keys of one tile.
std::vector<float>& KeyTile() {
  thread_local std::vector<float> tile;
  return tile;
}

/// norms[j] = sqrt(|k_j|^2) of the tile of head h at tile t.
void TileNorms(const TokenRows& keys, int64_t n, int64_t h, int64_t t, float* norms) {
  const int64_t j0 = t * kFastTokenTile;
  const int64_t count = std::min(kFastTokenTile, n - j0);
  HWY_DYNAMIC_DISPATCH(TileSquaredNorms)(keys.Rows(h * n + j0, count, &KeyTile()), count, keys.d,
                                         norms);
  for (int64_t j = 0; j < count; ++j) norms[j] = std::sqrt(norms[j]);
}

}  // namespace

void FastKeyNorms(const CpuLayer& layer, ThreadPool& pool, float* norms) {
  const int64_t n = layer.shape.num_tokens;
  const int64_t tiles = KeyTiles(n);
  const TokenRows keys = TokenRows::Keys(layer);
  pool.ParallelFor(layer.shape.num_kv_heads * tiles, [&](int64_t item) {
    const int64_t h = item / tiles, t = item % tiles;
    TileNorms(keys, n, h, t, norms + h * n + t * kFastTokenTile);
  });
}

void FastKeyDiffScores(const CpuLayer& layer, KeyDiffAnchor anchor, float eps, ThreadPool& pool,
                       float* scores) {
  const int64_t heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  if (n <= 0) return;
  const int64_t tiles = KeyTiles(n);
  const TokenRows keys = TokenRows::Keys(layer);
  std::vector<float> norms(static_cast<size_t>(heads * n));        // [H_kv, n]
  std::vector<float> sums(static_cast<size_t>(heads * tiles * d));  // [H_kv, tiles, d]
  // Pass 1: the norms and each tile's sum of the (unit) keys.
  pool.ParallelFor(heads * tiles, [&](int64_t item) {
    const int64_t h = item / tiles, t = item % tiles;
    const int64_t j0 = t * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, n - j0);
    float* tile_norms = norms.data() + h * n + j0;
    TileNorms(keys, n, h, t, tile_norms);
    float* sum = sums.data() + item * d;
    std::fill_n(sum, d, 0.0f);
    HWY_DYNAMIC_DISPATCH(TileAddRows)(keys.Rows(h * n + j0, count, &KeyTile()), count, d,
                                      tile_norms, anchor == KeyDiffAnchor::kNormalizedMean, sum);
  });
  // The anchors: the tiles' sums in order (fp64), over n; and their norms.
  std::vector<float> anchors(static_cast<size_t>(heads * d));  // [H_kv, d]
  std::vector<float> anchor_norms(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    double sq = 0;
    for (int64_t c = 0; c < d; ++c) {
      double s = 0;
      for (int64_t t = 0; t < tiles; ++t) s += sums[(h * tiles + t) * d + c];
      const double a = s / static_cast<double>(n);
      anchors[h * d + c] = static_cast<float>(a);
      sq += a * a;
    }
    anchor_norms[h] = static_cast<float>(std::sqrt(sq));
  }
  // Pass 2: the cosines.
  pool.ParallelFor(heads * tiles, [&](int64_t item) {
    const int64_t h = item / tiles, t = item % tiles;
    const int64_t j0 = t * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, n - j0);
    float* out = scores + h * n + j0;
    // k_j . a: the anchor as a query of one row, the dots one per token.
    HWY_DYNAMIC_DISPATCH(TileLogitsDot)(anchors.data() + h * d, 1,
                                        keys.Rows(h * n + j0, count, &KeyTile()), count, d,
                                        /*stride=*/1, out);
    for (int64_t j = 0; j < count; ++j) {
      const float prod = norms[h * n + j0 + j] * anchor_norms[h];
      const float denom = prod < eps ? eps : prod;
      out[j] = denom > 0.0f ? -(out[j] / denom) : 0.0f;
    }
  });
}

}  // namespace kvtrim

#endif  // HWY_ONCE
