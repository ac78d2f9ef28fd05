// Fast projected value norms and Expected Attention logits on the CPU (value_norms.h). The
// SIMD steps (tile_ops-inl.h) are compiled once per instruction set by Highway
// (foreach_target re-includes this file) and chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/value_norms.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/token_rows.h"
#include "kernels/cpu/fast/value_norms.h"

namespace kvtrim {

HWY_EXPORT(TileLogitsT);
HWY_EXPORT(TileAddAbsRows);
HWY_EXPORT(TileRowDots);

namespace {

/// Output columns of W_O^q per product block (a [d, 256] block of W_O^q transposed).
constexpr int64_t kColumnBlock = 256;

/// x rounded up to a multiple of 32 (every target's two vectors divide it).
int64_t PadTo32(int64_t x) { return (x + 31) / 32 * 32; }

/// Per-thread buffers of one (head, tile) item, reused across items and calls.
struct ProductScratch {
  std::vector<float> rows;     // [kFastTokenTile, d] widened values / keys
  std::vector<float> product;  // [kFastTokenTile, columns] one product block
  std::vector<float> sums;     // [kFastTokenTile] a row reduction
};

ProductScratch& ThreadScratch() {
  thread_local ProductScratch scratch;
  return scratch;
}

/// Each matrix m of mats [count, d, d] transposed and scaled: out [count, d, PadTo32(d)] with
/// out[m, i, r] = factor * mats[m, r, i] (zero columns r >= d).
std::vector<float> TransposedPadded(const float* mats, int64_t count, int64_t d, float factor) {
  const int64_t dp = PadTo32(d);
  std::vector<float> out(static_cast<size_t>(count * d * dp), 0.0f);
  for (int64_t m = 0; m < count; ++m) {
    for (int64_t r = 0; r < d; ++r) {
      for (int64_t i = 0; i < d; ++i) {
        out[(m * d + i) * dp + r] = factor * mats[(m * d + r) * d + i];
      }
    }
  }
  return out;
}

/// Calls body(h, j0, count, rows, scratch) for every (KV head h, tile of the first `tokens`
/// tokens at j0), one work item each on `pool`: rows [count, d] = the tile of `source` (a
/// layer's [H_kv, n, d] keys or values) in fp32, `scratch` the thread's buffers.
template <class Body>
void ForEachTile(const TokenRows& source, int64_t heads, int64_t n, int64_t tokens,
                 ThreadPool& pool, const Body& body) {
  const int64_t tiles = KeyTiles(tokens);
  pool.ParallelFor(heads * tiles, [&](int64_t item) {
    ProductScratch& s = ThreadScratch();
    const int64_t h = item / tiles, j0 = (item % tiles) * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, tokens - j0);
    body(h, j0, count, source.Rows(h * n + j0, count, &s.rows), s);
  });
}

/// out[j] = rows_j^T M rows_j for a tile's rows [count, d] and M given transposed and padded
/// (mt [d, dp], see TransposedPadded), plus rows_j . bias when bias is not null.
void TileQuadraticForms(const float* rows, int64_t count, int64_t d, const float* mt,
                        const float* bias, ProductScratch& s, float* out) {
  const int64_t dp = PadTo32(d);
  s.product.resize(static_cast<size_t>(kFastTokenTile * dp));
  HWY_DYNAMIC_DISPATCH(TileLogitsT)(mt, dp, dp, rows, count, d, s.product.data());
  HWY_DYNAMIC_DISPATCH(TileRowDots)(rows, s.product.data(), dp, bias, count, d, out);
}

}  // namespace

void FastProjectedL1Norms(const CpuLayer& layer, const float* w_o, int64_t hidden,
                          int64_t prefix, ThreadPool& pool, float* out) {
  const LayerShape& shape = layer.shape;
  const int64_t n = shape.num_tokens, d = shape.head_dim, hq = shape.num_query_heads;
  const int64_t group = shape.group_size();
  const int64_t columns = PadTo32(hidden);
  // W_O^q transposed in blocks of kColumnBlock output columns: block e0 of query head q is
  // [d, width] at q * d * columns + e0 * d (width = min(kColumnBlock, columns - e0)).
  std::vector<float> blocks(static_cast<size_t>(hq * d * columns), 0.0f);
  pool.ParallelFor(hq, [&](int64_t q) {
    for (int64_t e0 = 0; e0 < columns; e0 += kColumnBlock) {
      const int64_t width = std::min(kColumnBlock, columns - e0);
      float* block = blocks.data() + q * d * columns + e0 * d;
      for (int64_t e = e0; e < std::min(hidden, e0 + width); ++e) {
        const float* row = w_o + e * hq * d + q * d;
        for (int64_t i = 0; i < d; ++i) block[i * width + (e - e0)] = row[i];
      }
    }
  });
  auto tile = [&](int64_t h, int64_t j0, int64_t count, const float* v, ProductScratch& s) {
    s.product.resize(static_cast<size_t>(kFastTokenTile * kColumnBlock));
    s.sums.resize(static_cast<size_t>(kFastTokenTile));
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      std::fill_n(s.sums.begin(), count, 0.0f);
      for (int64_t e0 = 0; e0 < columns; e0 += kColumnBlock) {
        const int64_t width = std::min(kColumnBlock, columns - e0);
        HWY_DYNAMIC_DISPATCH(TileLogitsT)(blocks.data() + q * d * columns + e0 * d, width, width,
                                          v, count, d, s.product.data());
        HWY_DYNAMIC_DISPATCH(TileAddAbsRows)(s.product.data(), count, width, s.sums.data());
      }
      std::copy_n(s.sums.begin(), count, out + q * prefix + j0);
    }
  };
  ForEachTile(TokenRows::Values(layer), shape.num_kv_heads, n, prefix, pool, tile);
}

void FastGramNorms(const CpuLayer& layer, const float* grams, int64_t per_head, int64_t prefix,
                   ThreadPool& pool, float* out) {
  const LayerShape& shape = layer.shape;
  const int64_t n = shape.num_tokens, d = shape.head_dim;
  const int64_t dp = PadTo32(d);
  const std::vector<float> transposed =
      TransposedPadded(grams, shape.num_kv_heads * per_head, d, 1.0f);
  auto tile = [&](int64_t h, int64_t j0, int64_t count, const float* v, ProductScratch& s) {
    for (int64_t i = 0; i < per_head; ++i) {
      const int64_t m = h * per_head + i;
      float* dst = out + m * prefix + j0;
      TileQuadraticForms(v, count, d, transposed.data() + m * d * dp, nullptr, s, dst);
      for (int64_t j = 0; j < count; ++j) dst[j] = std::sqrt(std::max(0.0f, dst[j]));
    }
  };
  ForEachTile(TokenRows::Values(layer), shape.num_kv_heads, n, prefix, pool, tile);
}

void FastExpectedLogits(const CpuLayer& layer, const float* mean, const float* cov, float scale,
                        float half_scale2, ThreadPool& pool, float* out) {
  const LayerShape& shape = layer.shape;
  const int64_t n = shape.num_tokens, d = shape.head_dim, hq = shape.num_query_heads;
  const int64_t group = shape.group_size();
  const int64_t dp = PadTo32(d);
  const std::vector<float> transposed = TransposedPadded(cov, hq, d, half_scale2);
  std::vector<float> bias(static_cast<size_t>(hq * d));
  for (int64_t i = 0; i < hq * d; ++i) bias[i] = scale * mean[i];
  auto tile = [&](int64_t h, int64_t j0, int64_t count, const float* k, ProductScratch& s) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      TileQuadraticForms(k, count, d, transposed.data() + q * d * dp, bias.data() + q * d, s,
                         out + q * n + j0);
    }
  };
  ForEachTile(TokenRows::Keys(layer), shape.num_kv_heads, n, n, pool, tile);
}

}  // namespace kvtrim

#endif  // HWY_ONCE
