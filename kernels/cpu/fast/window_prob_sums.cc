// Fast window attention probability sums on the CPU (window_prob_sums.h). The SIMD steps
// (tile_ops-inl.h) are compiled once per instruction set by Highway (foreach_target
// re-includes this file) and chosen at run time; the passes around them are plain C++.
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/window_prob_sums.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <vector>

#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/token_rows.h"
#include "kernels/cpu/fast/window_prob_sums.h"

namespace kvtrim {

HWY_EXPORT(TileLogitsT);
HWY_EXPORT(TileLogitsDot);
HWY_EXPORT(TileRowStats);
HWY_EXPORT(TileAddProbs);
HWY_EXPORT(TileAddScaled);
HWY_EXPORT(FloatLanes);

namespace {

/// Per-thread buffers of one (head, tile) work item, reused across items and calls.
struct TileScratch {
  std::vector<float> logits;  // [kFastTokenTile, padded rows] token-major
  std::vector<float> seen;    // [padded rows] tokens of the tile each row sees
  std::vector<float> keys;    // [kFastTokenTile, d] widened keys of the tile
};

TileScratch& ThreadScratch() {
  thread_local TileScratch scratch;
  return scratch;
}

/// Largest padded row count whose logits are kept between the passes (one AVX-512 vector:
/// TOVA's G rows; the keys are then read once). More rows recompute them in the second pass:
/// never a [G * w, n] matrix.
constexpr int64_t kMaxCachedRows = 16;
/// Most rows whose logits are dot products over d (TileLogitsDot): fewer lanes wasted than
/// a vector of rows per token.
constexpr int64_t kMaxDotRows = 8;

/// The fixed geometry of one call: rows, their visibility, the scaled queries.
struct Passes {
  int64_t heads = 0, n = 0, d = 0, tiles = 0;
  int64_t padded_rows = 0;       // rows rounded up to two vectors (zero rows past them)
  std::vector<int64_t> visible;  // [padded_rows] V_r (0 for the padding)
  int64_t rows = 0;              // the real rows (G * window)
  std::vector<float> queries_t;  // [H_kv, d, padded_rows] scale * q, transposed (else empty)
  std::vector<float> queries;    // [H_kv, rows, d] scale * q (few rows: TileLogitsDot)
  TokenRows keys;                // [H_kv, n, d] as they arrived
  std::vector<float> cached;     // [H_kv * tiles, kFastTokenTile, padded_rows] or empty

  /// The logits of tile `tile` of head `h` [kFastTokenTile, padded_rows]: computed into
  /// the cache (first pass) or scratch, or read back from the cache (`again`); fills
  /// scratch.seen with what each row sees of the tile.
  /// Thread-safe across different (h, tile): each writes its own slot of the cache.
  const float* Logits(int64_t h, int64_t tile, bool again, TileScratch& scratch) {
    const int64_t j0 = tile * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, n - j0);
    scratch.seen.resize(static_cast<size_t>(padded_rows));
    SeenRows(visible, 0, padded_rows, j0, count, scratch.seen.data());
    float* out = nullptr;
    if (!cached.empty()) {
      out = cached.data() + (h * tiles + tile) * kFastTokenTile * padded_rows;
      if (again) return out;
    } else {
      scratch.logits.resize(static_cast<size_t>(kFastTokenTile * padded_rows));
      out = scratch.logits.data();
    }
    const float* k = keys.Rows(h * n + j0, count, &scratch.keys);
    if (rows <= kMaxDotRows) {
      HWY_DYNAMIC_DISPATCH(TileLogitsDot)(queries.data() + h * rows * d, rows, k, count, d,
                                          padded_rows, out);
    } else {
      HWY_DYNAMIC_DISPATCH(TileLogitsT)(queries_t.data() + h * d * padded_rows, padded_rows,
                                        padded_rows, k, count, d, out);
    }
    return out;
  }
};

/// The slab path: one work item per (head, block of kSlabRows rows) computes the block's
/// logits over every token once into a per-thread slab [n, kSlabRows], then its rows'
/// statistics and probabilities from the slab; partial [n] gets the block's sums per token.
void SlabItem(const Passes& p, int64_t h, int64_t r0, float* partial) {
  thread_local std::vector<float> slab, stats, seen, key_tile;
  constexpr int64_t kB = kSlabRows;
  slab.resize(static_cast<size_t>(p.tiles * kFastTokenTile * kB));
  stats.resize(static_cast<size_t>(3 * p.tiles * kB + 2 * kB));
  seen.resize(static_cast<size_t>(kB));
  float* tile_max = stats.data();
  float* tile_sum = tile_max + p.tiles * kB;
  float* factors = tile_sum + p.tiles * kB;
  float* neg_max = factors + p.tiles * kB;
  float* inv_sum = neg_max + kB;
  // The logits, then in place each tile's exp(l - m_t): one exp per (row, token).
  for (int64_t t = 0; t < p.tiles; ++t) {
    const int64_t j0 = t * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, p.n - j0);
    float* lt = slab.data() + j0 * kB;
    HWY_DYNAMIC_DISPATCH(TileLogitsT)(p.queries_t.data() + h * p.d * p.padded_rows + r0,
                                      p.padded_rows, kB,
                                      p.keys.Rows(h * p.n + j0, count, &key_tile), count, p.d,
                                      lt);
    SeenRows(p.visible, r0, kB, j0, count, seen.data());
    HWY_DYNAMIC_DISPATCH(TileRowStats)(lt, count, kB, seen.data(), tile_max + t * kB,
                                       tile_sum + t * kB, lt);
  }
  CombineTiles(tile_max, tile_sum, p.tiles, kB, kB, neg_max, inv_sum);
  TileFactors(tile_max, tile_sum, p.tiles, kB, kB, neg_max, inv_sum, factors);
  for (int64_t t = 0; t < p.tiles; ++t) {
    const int64_t j0 = t * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, p.n - j0);
    HWY_DYNAMIC_DISPATCH(TileAddScaled)(slab.data() + j0 * kB, count, kB, factors + t * kB,
                                        partial + j0);
  }
}

}  // namespace

void FastWindowProbSums(const CpuLayer& layer, int64_t first_row, ThreadPool& pool,
                        float* sums) {
  const LayerShape& shape = layer.shape;
  Passes p;
  p.heads = shape.num_kv_heads;
  p.n = shape.num_tokens;
  p.d = shape.head_dim;
  p.tiles = (p.n + kFastTokenTile - 1) / kFastTokenTile;
  p.keys = TokenRows::Keys(layer);
  const int64_t w = shape.window_rows;
  const int64_t group = shape.group_size();
  const int64_t window = w - first_row;
  const int64_t rows = group * window;
  p.rows = rows;
  // Three ways, by the rows: a few (TOVA's G): dot products, logits kept between the passes;
  // up to 64K tokens: slabs of kSlabRows rows, logits computed once; else two passes over
  // key tiles, logits computed twice. All with fixed work items and reduction orders.
  const bool slab = rows > kMaxDotRows &&
                    p.tiles * kFastTokenTile * kSlabRows * 4 <= MaxSlabBytes();
  const int64_t lanes = HWY_DYNAMIC_DISPATCH(FloatLanes)();
  const int64_t block = slab ? kSlabRows : rows > lanes ? 2 * lanes : lanes;
  p.padded_rows = (rows + block - 1) / block * block;
  p.visible.assign(static_cast<size_t>(p.padded_rows), 0);
  const bool dot = rows <= kMaxDotRows;  // TileLogitsDot reads `queries`, else `queries_t`
  (dot ? p.queries : p.queries_t)
      .assign(static_cast<size_t>(p.heads * (dot ? rows : p.padded_rows) * p.d), 0.0f);
  for (int64_t h = 0; h < p.heads; ++h) {
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = first_row; t < w; ++t) {
        const int64_t r = g * window + (t - first_row);
        p.visible[r] = std::clamp<int64_t>(p.n - w + t + 1, 0, p.n);
        const float* q = layer.queries.data() + ((h * group + g) * w + t) * p.d;
        for (int64_t i = 0; i < p.d; ++i) {
          const float scaled = q[i] * layer.softmax_scale;
          if (dot) {
            p.queries[(h * rows + r) * p.d + i] = scaled;
          } else {
            p.queries_t[(h * p.d + i) * p.padded_rows + r] = scaled;
          }
        }
      }
    }
  }
  const int64_t pr = p.padded_rows;
  if (slab) {
    const int64_t blocks = pr / kSlabRows;
    std::vector<float> partial(static_cast<size_t>(p.heads * blocks * p.n));
    pool.ParallelFor(p.heads * blocks, [&](int64_t item) {
      SlabItem(p, item / blocks, (item % blocks) * kSlabRows, partial.data() + item * p.n);
    });
    for (int64_t h = 0; h < p.heads; ++h) {  // the blocks' sums, in block order
      float* out = sums + h * p.n;
      std::copy_n(partial.data() + h * blocks * p.n, p.n, out);
      for (int64_t b = 1; b < blocks; ++b) {
        const float* part = partial.data() + (h * blocks + b) * p.n;
        for (int64_t j = 0; j < p.n; ++j) out[j] += part[j];
      }
    }
    return;
  }
  // Pass 1: each row's maximum and sum of exp per tile.
  const int64_t items = p.heads * p.tiles;
  std::vector<float> tile_max(static_cast<size_t>(items * pr));
  std::vector<float> tile_sum(tile_max.size());
  if (pr <= kMaxCachedRows) p.cached.resize(static_cast<size_t>(items * kFastTokenTile * pr));
  pool.ParallelFor(items, [&](int64_t item) {
    TileScratch& scratch = ThreadScratch();
    const int64_t j0 = (item % p.tiles) * kFastTokenTile;
    const float* logits = p.Logits(item / p.tiles, item % p.tiles, /*again=*/false, scratch);
    HWY_DYNAMIC_DISPATCH(TileRowStats)(logits, std::min(kFastTokenTile, p.n - j0),
                                       pr, scratch.seen.data(), tile_max.data() + item * pr,
                                       tile_sum.data() + item * pr, nullptr);
  });
  // The rows' -M and 1 / Z, the tiles combined in order.
  std::vector<float> neg_max(static_cast<size_t>(p.heads * pr), 0.0f);
  std::vector<float> inv_sum(neg_max.size(), 0.0f);
  for (int64_t h = 0; h < p.heads; ++h) {
    CombineTiles(tile_max.data() + h * p.tiles * pr, tile_sum.data() + h * p.tiles * pr,
                 p.tiles, pr, rows, neg_max.data() + h * pr, inv_sum.data() + h * pr);
  }
  // Pass 2: the probabilities, summed over the rows per token.
  pool.ParallelFor(items, [&](int64_t item) {
    TileScratch& scratch = ThreadScratch();
    const int64_t h = item / p.tiles;
    const int64_t j0 = (item % p.tiles) * kFastTokenTile;
    const float* logits = p.Logits(h, item % p.tiles, /*again=*/true, scratch);
    HWY_DYNAMIC_DISPATCH(TileAddProbs)(logits, std::min(kFastTokenTile, p.n - j0),
                                       pr, scratch.seen.data(), neg_max.data() + h * pr,
                                       inv_sum.data() + h * pr, sums + h * p.n + j0);
  });
}

}  // namespace kvtrim

#endif  // HWY_ONCE
