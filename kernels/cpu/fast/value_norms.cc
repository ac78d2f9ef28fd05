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
HWY_EXPORT(TileLowerProductT);
HWY_EXPORT(TileAddAbsRows);
HWY_EXPORT(TileRowDots);
HWY_EXPORT(TileSquaresPlusDot);

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

/// The symmetric d x d matrices of one call as the tiles read them: a matrix that is
/// numerically positive definite as its lower Cholesky factor L (M = L L^T, factored in fp64,
/// stored fp32): x^T M x = |L^T x|^2 takes the triangular product y = x L (about half the
/// multiplications of y = M x) and a sum of squares; any other (a rank-deficient Gram matrix,
/// a covariance estimated from fewer rows than d) as M^T itself, the full product y = M x and
/// x . y. Each image is [d, PadTo32(d)], zero-padded.
class QuadraticForms {
 public:
  /// Prepares mats [count, d, d] (one matrix per item of `pool`); `factor` scales every form.
  QuadraticForms(const float* mats, int64_t count, int64_t d, float factor, ThreadPool& pool)
      : d_(d), dp_(PadTo32(d)), factor_(factor),
        images_(static_cast<size_t>(count * d * dp_), 0.0f),
        factored_(static_cast<size_t>(count), 0) {
    pool.ParallelFor(count, [&](int64_t m) { Prepare(mats + m * d * d, m); });
  }

  /// out[j] = factor * x_j^T M_m x_j + x_j . bias (no bias when null) for a tile's rows x
  /// [count, d].
  void Tile(int64_t m, const float* x, int64_t count, const float* bias, ProductScratch& s,
            float* out) const {
    s.product.resize(static_cast<size_t>(kFastTokenTile * dp_));
    const float* image = images_.data() + m * d_ * dp_;
    if (factored_[m]) {
      HWY_DYNAMIC_DISPATCH(TileLowerProductT)(image, dp_, dp_, x, count, d_, s.product.data());
      HWY_DYNAMIC_DISPATCH(TileSquaresPlusDot)(s.product.data(), dp_, dp_, factor_, x, d_, bias,
                                               count, out);
    } else {
      HWY_DYNAMIC_DISPATCH(TileLogitsT)(image, dp_, dp_, x, count, d_, s.product.data());
      HWY_DYNAMIC_DISPATCH(TileRowDots)(x, s.product.data(), dp_, bias, count, d_, out);
    }
  }

 private:
  /// Factors matrix m (or keeps factor * M^T where a pivot is not clearly positive: at most
  /// 1e-9 of the largest diagonal entry).
  void Prepare(const float* mat, int64_t m) {
    const int64_t d = d_;
    std::vector<double> l(static_cast<size_t>(d * d), 0.0);
    double largest = 0;
    for (int64_t i = 0; i < d; ++i) {
      largest = std::max(largest, static_cast<double>(mat[i * d + i]));
    }
    bool ok = largest > 0;
    for (int64_t c = 0; ok && c < d; ++c) {
      double pivot = mat[c * d + c];
      for (int64_t k = 0; k < c; ++k) pivot -= l[c * d + k] * l[c * d + k];
      if (!(pivot > 1e-9 * largest)) {
        ok = false;
        break;
      }
      const double root = std::sqrt(pivot);
      l[c * d + c] = root;
      for (int64_t i = c + 1; i < d; ++i) {
        // The symmetric matrix's lower half (its average with the upper half: Gram and
        // covariance matrices are symmetric up to their own rounding).
        double v = 0.5 * (static_cast<double>(mat[i * d + c]) + mat[c * d + i]);
        for (int64_t k = 0; k < c; ++k) v -= l[i * d + k] * l[c * d + k];
        l[i * d + c] = v / root;
      }
    }
    float* image = images_.data() + m * d * dp_;
    factored_[m] = ok ? 1 : 0;
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t c = 0; c < d; ++c) {
        // image[i, c]: L[i][c] (lower triangular), or factor * M[c][i] (M^T).
        image[i * dp_ + c] = ok ? static_cast<float>(l[i * d + c]) : factor_ * mat[c * d + i];
      }
    }
  }

  int64_t d_, dp_;
  float factor_;
  std::vector<float> images_;   // [count, d, dp]
  std::vector<char> factored_;  // [count] 1: images_ holds L
};

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
  const QuadraticForms forms(grams, shape.num_kv_heads * per_head, d, 1.0f, pool);
  auto tile = [&](int64_t h, int64_t j0, int64_t count, const float* v, ProductScratch& s) {
    for (int64_t i = 0; i < per_head; ++i) {
      const int64_t m = h * per_head + i;
      float* dst = out + m * prefix + j0;
      forms.Tile(m, v, count, nullptr, s, dst);
      for (int64_t j = 0; j < count; ++j) dst[j] = std::sqrt(std::max(0.0f, dst[j]));
    }
  };
  ForEachTile(TokenRows::Values(layer), shape.num_kv_heads, n, prefix, pool, tile);
}

void FastExpectedLogits(const CpuLayer& layer, const float* mean, const float* cov,
                        int64_t num_query_heads, float scale, float half_scale2,
                        ThreadPool& pool, float* out) {
  const LayerShape& shape = layer.shape;
  const int64_t n = shape.num_tokens, d = shape.head_dim, hq = num_query_heads;
  const int64_t group = hq / shape.num_kv_heads;
  const QuadraticForms forms(cov, hq, d, half_scale2, pool);
  std::vector<float> bias(static_cast<size_t>(hq * d));
  for (int64_t i = 0; i < hq * d; ++i) bias[i] = scale * mean[i];
  auto tile = [&](int64_t h, int64_t j0, int64_t count, const float* k, ProductScratch& s) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      forms.Tile(q, k, count, bias.data() + q * d, s, out + q * n + j0);
    }
  };
  ForEachTile(TokenRows::Keys(layer), shape.num_kv_heads, n, n, pool, tile);
}

}  // namespace kvtrim

#endif  // HWY_ONCE
