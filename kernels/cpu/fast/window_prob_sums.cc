// Fast window attention probability sums on the CPU (window_prob_sums.h). The SIMD parts are
// compiled once per instruction set by Highway (foreach_target re-includes this file) and
// chosen at run time; the passes around them are plain C++.
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/window_prob_sums.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvtrim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// lt [count, rows] = k [count, d] . qt [d, rows] (qt's rows `q_stride` apart): the logits
/// of `count` tokens (keys in their own row-major layout) against the scaled query rows
/// transposed (rows a multiple of the vector length). Blocks of 4 tokens x 2 row vectors (or
/// x 1) held in registers across d, one fused multiply-add per token and vector.
void TileLogitsT(const float* qt, int64_t q_stride, int64_t rows, const float* k,
                 int64_t count, int64_t d, float* lt) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; r += lanes) {
    const bool two = r + 2 * lanes <= rows;
    int64_t j = 0;
    if (two) {
      for (; j + 4 <= count; j += 4) {
        const float* k0 = k + j * d;
        auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
        auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
        for (int64_t i = 0; i < d; ++i) {
          const auto q0 = hn::LoadU(df, qt + i * q_stride + r);
          const auto q1 = hn::LoadU(df, qt + i * q_stride + r + lanes);
          const auto b0 = hn::Set(df, k0[i]);
          const auto b1 = hn::Set(df, k0[d + i]);
          const auto b2 = hn::Set(df, k0[2 * d + i]);
          const auto b3 = hn::Set(df, k0[3 * d + i]);
          a00 = hn::MulAdd(b0, q0, a00);
          a01 = hn::MulAdd(b0, q1, a01);
          a10 = hn::MulAdd(b1, q0, a10);
          a11 = hn::MulAdd(b1, q1, a11);
          a20 = hn::MulAdd(b2, q0, a20);
          a21 = hn::MulAdd(b2, q1, a21);
          a30 = hn::MulAdd(b3, q0, a30);
          a31 = hn::MulAdd(b3, q1, a31);
        }
        float* out = lt + j * rows + r;
        hn::StoreU(a00, df, out);
        hn::StoreU(a01, df, out + lanes);
        hn::StoreU(a10, df, out + rows);
        hn::StoreU(a11, df, out + rows + lanes);
        hn::StoreU(a20, df, out + 2 * rows);
        hn::StoreU(a21, df, out + 2 * rows + lanes);
        hn::StoreU(a30, df, out + 3 * rows);
        hn::StoreU(a31, df, out + 3 * rows + lanes);
      }
    } else {
      for (; j + 4 <= count; j += 4) {
        const float* k0 = k + j * d;
        auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
        for (int64_t i = 0; i < d; ++i) {
          const auto q0 = hn::LoadU(df, qt + i * q_stride + r);
          a0 = hn::MulAdd(hn::Set(df, k0[i]), q0, a0);
          a1 = hn::MulAdd(hn::Set(df, k0[d + i]), q0, a1);
          a2 = hn::MulAdd(hn::Set(df, k0[2 * d + i]), q0, a2);
          a3 = hn::MulAdd(hn::Set(df, k0[3 * d + i]), q0, a3);
        }
        float* out = lt + j * rows + r;
        hn::StoreU(a0, df, out);
        hn::StoreU(a1, df, out + rows);
        hn::StoreU(a2, df, out + 2 * rows);
        hn::StoreU(a3, df, out + 3 * rows);
      }
    }
    for (; j < count; ++j) {  // the tile's last tokens, one at a time
      for (int64_t v = 0; v < (two ? 2 : 1); ++v) {
        auto a = hn::Zero(df);
        for (int64_t i = 0; i < d; ++i) {
          a = hn::MulAdd(hn::Set(df, k[j * d + i]),
                         hn::LoadU(df, qt + i * q_stride + r + v * lanes), a);
        }
        hn::StoreU(a, df, lt + j * rows + r + v * lanes);
      }
    }
    if (two) r += lanes;
  }
}

/// lt[j, r] = q_r . k_j for the first `rows` rows of q [rows, d] (row-major) and `count`
/// tokens (the columns of lt past `rows`, up to `stride`, are left as they are): each dot
/// product vectorised over d and reduced across lanes. For a few rows (TOVA's G), where
/// TileLogitsT would compute a whole vector of rows for each token.
void TileLogitsDot(const float* q, int64_t rows, const float* k, int64_t count, int64_t d,
                   int64_t stride, float* lt) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const float* kj = k + j * d;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * d;
      auto acc = hn::Zero(df);
      int64_t i = 0;
      for (; i + lanes <= d; i += lanes) {
        acc = hn::MulAdd(hn::LoadU(df, qr + i), hn::LoadU(df, kj + i), acc);
      }
      float dot = hn::GetLane(hn::SumOfLanes(df, acc));
      for (; i < d; ++i) dot += qr[i] * kj[i];
      lt[j * stride + r] = dot;
    }
  }
}

/// Per row r (vectorised over rows) of lt [count, rows]: the maximum and the sum of exp(l -
/// max) over the tokens j < seen[r] (seen: floats, 0 for rows that see none of the tile,
/// whose maximum is then -inf and sum 0).
void TileRowStats(const float* lt, int64_t count, int64_t rows, const float* seen,
                  float* max_out, float* sum_out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto neg_inf = hn::Set(df, -HUGE_VALF);
  for (int64_t r = 0; r < rows; r += lanes) {
    const auto limit = hn::LoadU(df, seen + r);
    auto m = neg_inf;
    for (int64_t j = 0; j < count; ++j) {
      const auto visible = hn::Lt(hn::Set(df, static_cast<float>(j)), limit);
      m = hn::Max(m, hn::IfThenElse(visible, hn::LoadU(df, lt + j * rows + r), neg_inf));
    }
    // Rows that see nothing keep -inf; shift them by 0 so that exp stays finite (masked).
    const auto shift = hn::IfThenElse(hn::Eq(m, neg_inf), hn::Zero(df), hn::Neg(m));
    auto s = hn::Zero(df);
    for (int64_t j = 0; j < count; ++j) {
      const auto visible = hn::Lt(hn::Set(df, static_cast<float>(j)), limit);
      const auto e = hn::Exp(df, hn::Add(hn::LoadU(df, lt + j * rows + r), shift));
      s = hn::Add(s, hn::IfThenElseZero(visible, e));
    }
    hn::StoreU(m, df, max_out + r);
    hn::StoreU(s, df, sum_out + r);
  }
}

/// sums[j] = sum over rows r with j < seen[r] of exp(lt[j, r] + neg_max[r]) * inv_sum[r],
/// for j < count (the rows' vectors added in order, then across lanes).
void TileAddProbs(const float* lt, int64_t count, int64_t rows, const float* seen,
                  const float* neg_max, const float* inv_sum, float* sums) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const auto token = hn::Set(df, static_cast<float>(j));
    auto acc = hn::Zero(df);
    for (int64_t r = 0; r < rows; r += lanes) {
      const auto visible = hn::Lt(token, hn::LoadU(df, seen + r));
      const auto e = hn::Exp(df, hn::Add(hn::LoadU(df, lt + j * rows + r), hn::LoadU(df, neg_max + r)));
      acc = hn::Add(acc, hn::IfThenElseZero(visible, hn::Mul(e, hn::LoadU(df, inv_sum + r))));
    }
    sums[j] = hn::GetLane(hn::SumOfLanes(df, acc));
  }
}

/// Lanes of a float vector on this target.
int64_t FloatLanes() { return static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>())); }

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast/window_prob_sums.h"

namespace kvtrim {

HWY_EXPORT(TileLogitsT);
HWY_EXPORT(TileLogitsDot);
HWY_EXPORT(TileRowStats);
HWY_EXPORT(TileAddProbs);
HWY_EXPORT(FloatLanes);

namespace {

/// Per-thread buffers of one (head, tile) work item, reused across items and calls.
struct TileScratch {
  std::vector<float> logits;  // [kFastTokenTile, padded rows] token-major
  std::vector<float> seen;    // [padded rows] tokens of the tile each row sees
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

/// The tokens of the tile at j0 (count tokens) that rows [r0, r0 + rows) see, as floats.
void SeenRows(const std::vector<int64_t>& visible, int64_t r0, int64_t rows, int64_t j0,
              int64_t count, float* seen) {
  for (int64_t r = 0; r < rows; ++r) {
    seen[r] = static_cast<float>(std::clamp<int64_t>(visible[r0 + r] - j0, 0, count));
  }
}

/// The fixed geometry of one call: rows, their visibility, the scaled queries.
struct Passes {
  int64_t heads = 0, n = 0, d = 0, tiles = 0;
  int64_t padded_rows = 0;       // rows rounded up to two vectors (zero rows past them)
  std::vector<int64_t> visible;  // [padded_rows] V_r (0 for the padding)
  int64_t rows = 0;              // the real rows (G * window)
  std::vector<float> queries_t;  // [H_kv, d, padded_rows] scale * q, transposed (else empty)
  std::vector<float> queries;    // [H_kv, rows, d] scale * q (few rows: TileLogitsDot)
  const float* keys = nullptr;   // [H_kv, n, d]
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
    if (rows <= kMaxDotRows) {
      HWY_DYNAMIC_DISPATCH(TileLogitsDot)(queries.data() + h * rows * d, rows,
                                          keys + (h * n + j0) * d, count, d, padded_rows, out);
    } else {
      HWY_DYNAMIC_DISPATCH(TileLogitsT)(queries_t.data() + h * d * padded_rows, padded_rows,
                                        padded_rows, keys + (h * n + j0) * d, count, d, out);
    }
    return out;
  }
};

/// Rows of one slab (the slab path's row block): a multiple of every target's two vectors.
constexpr int64_t kSlabRows = 32;
/// Largest slab: kSlabRows rows' logits over every token of a head, per thread (n <= 64K
/// by default; SetCpuSlabBytesForTest changes it).
std::atomic<int64_t> max_slab_bytes{int64_t{8} << 20};

/// Each row's -M and 1 / Z from its per-tile maxima and sums [tiles, stride] (row r at
/// offset r), the tiles combined in order; 0 and 0 for rows that see nothing.
void CombineTiles(const float* tile_max, const float* tile_sum, int64_t tiles, int64_t stride,
                  int64_t rows, float* neg_max, float* inv_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float m = -HUGE_VALF;
    for (int64_t t = 0; t < tiles; ++t) m = std::max(m, tile_max[t * stride + r]);
    double z = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const float s = tile_sum[t * stride + r];
      if (s > 0.0f) z += static_cast<double>(s) * std::exp(tile_max[t * stride + r] - m);
    }
    neg_max[r] = z > 0 ? -m : 0.0f;
    inv_sum[r] = z > 0 ? static_cast<float>(1.0 / z) : 0.0f;
  }
}

/// The slab path: one work item per (head, block of kSlabRows rows) computes the block's
/// logits over every token once into a per-thread slab [n, kSlabRows], then its rows'
/// statistics and probabilities from the slab; partial [n] gets the block's sums per token.
void SlabItem(const Passes& p, int64_t h, int64_t r0, float* partial) {
  thread_local std::vector<float> slab, stats, seen;
  constexpr int64_t kB = kSlabRows;
  slab.resize(static_cast<size_t>(p.tiles * kFastTokenTile * kB));
  stats.resize(static_cast<size_t>(2 * p.tiles * kB + 2 * kB));
  seen.resize(static_cast<size_t>(kB));
  float* tile_max = stats.data();
  float* tile_sum = tile_max + p.tiles * kB;
  float* neg_max = tile_sum + p.tiles * kB;
  float* inv_sum = neg_max + kB;
  for (int64_t t = 0; t < p.tiles; ++t) {
    const int64_t j0 = t * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, p.n - j0);
    HWY_DYNAMIC_DISPATCH(TileLogitsT)(p.queries_t.data() + h * p.d * p.padded_rows + r0,
                                      p.padded_rows, kB, p.keys + (h * p.n + j0) * p.d, count,
                                      p.d, slab.data() + j0 * kB);
    SeenRows(p.visible, r0, kB, j0, count, seen.data());
    HWY_DYNAMIC_DISPATCH(TileRowStats)(slab.data() + j0 * kB, count, kB, seen.data(),
                                       tile_max + t * kB, tile_sum + t * kB);
  }
  CombineTiles(tile_max, tile_sum, p.tiles, kB, kB, neg_max, inv_sum);
  for (int64_t t = 0; t < p.tiles; ++t) {
    const int64_t j0 = t * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, p.n - j0);
    SeenRows(p.visible, r0, kB, j0, count, seen.data());
    HWY_DYNAMIC_DISPATCH(TileAddProbs)(slab.data() + j0 * kB, count, kB, seen.data(), neg_max,
                                       inv_sum, partial + j0);
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
  p.keys = layer.keys.data();
  const int64_t w = shape.window_rows;
  const int64_t group = shape.group_size();
  const int64_t window = w - first_row;
  const int64_t rows = group * window;
  p.rows = rows;
  // Three ways, by the rows: a few (TOVA's G): dot products, logits kept between the passes;
  // up to 64K tokens: slabs of kSlabRows rows, logits computed once; else two passes over
  // key tiles, logits computed twice. All with fixed work items and reduction orders.
  const bool slab = rows > kMaxDotRows &&
                    p.tiles * kFastTokenTile * kSlabRows * 4 <= max_slab_bytes.load();
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
                                       tile_sum.data() + item * pr);
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

std::string FastCpuTarget() {
  hwy::ChosenTarget& chosen = hwy::GetChosenTarget();
  if (!chosen.IsInitialized()) chosen.Update(hwy::SupportedTargets());
  // The best target both supported and compiled, as the dispatch picks it.
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);
}

void SetCpuSlabBytesForTest(int64_t bytes) { max_slab_bytes = bytes; }

void SetCpuSimdLimitForTest(CpuSimdLimit limit) {
  int64_t mask = 0;  // 0: the CPU's own targets
  if (limit == CpuSimdLimit::kAvx2) mask = HWY_AVX2 | HWY_SSE4 | HWY_SSSE3 | HWY_SCALAR;
  if (limit == CpuSimdLimit::kScalar) mask = HWY_SCALAR;
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace kvtrim

#endif  // HWY_ONCE
