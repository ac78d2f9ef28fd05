// Softmax attention of a block of window rows on the CPU (row_attention.h). The SIMD steps
// (tile_ops-inl.h) are compiled once per instruction set by Highway (foreach_target
// re-includes this file) and chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/row_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <algorithm>

#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/row_attention.h"

namespace kvtrim {

HWY_EXPORT(TileLogitsT);
HWY_EXPORT(TileRowStats);
HWY_EXPORT(TileProbs);
HWY_EXPORT(TileScaleRows);
HWY_EXPORT(TileAddPV);

void WindowRowBlocks(const CpuLayer& layer, int64_t rows_per_head, int64_t padded,
                     std::vector<float>* queries_t, std::vector<int64_t>* visible) {
  WindowRowBlocks(
      layer, rows_per_head, padded,
      [rows_per_head](int64_t g, int64_t row) { return g * rows_per_head + row; }, queries_t,
      visible);
}

void WindowRowBlocks(const CpuLayer& layer, int64_t rows_per_head, int64_t padded,
                     const std::function<int64_t(int64_t g, int64_t row)>& column,
                     std::vector<float>* queries_t, std::vector<int64_t>* visible) {
  const LayerShape& shape = layer.shape;
  const int64_t n = shape.num_tokens, d = shape.head_dim, w = shape.window_rows;
  const int64_t group = shape.group_size();
  visible->assign(static_cast<size_t>(padded), 0);
  queries_t->assign(static_cast<size_t>(shape.num_kv_heads * d * padded), 0.0f);
  for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = w - rows_per_head; t < w; ++t) {
        const int64_t r = column(g, t - (w - rows_per_head));
        (*visible)[r] = std::clamp<int64_t>(n - w + t + 1, 0, n);
        const float* q = layer.queries.row(h * group + g, t);
        for (int64_t i = 0; i < d; ++i) {
          (*queries_t)[(h * d + i) * padded + r] = q[i] * layer.softmax_scale;
        }
      }
    }
  }
}

int64_t RowBlockSize(int64_t rows) { return rows <= 16 ? 16 : kSlabRows; }

int64_t RowBlockSoftmax::TileCount(int64_t t) const {
  return std::min(kFastTokenTile, m_ - t * kFastTokenTile);
}

void RowBlockSoftmax::Prepare(const RowBlock& block, const TokenRows& keys, int64_t m,
                              bool keep) {
  block_ = block;
  keys_ = keys;
  m_ = m;
  const int64_t d = d_ = keys.d;
  tiles_ = KeyTiles(m);
  keep_ = keep;
  const int64_t rows = block.rows;
  visible_.assign(block.visible, block.visible + rows);
  logits_.resize(static_cast<size_t>((keep ? tiles_ : 1) * kFastTokenTile * rows));
  converted_.assign(static_cast<size_t>(tiles_), false);
  stats_.resize(static_cast<size_t>(3 * tiles_ * rows));
  neg_max_.resize(static_cast<size_t>(rows));
  inv_sum_.resize(static_cast<size_t>(rows));
  seen_.resize(static_cast<size_t>(rows));
  float* tile_max = stats_.data();
  float* tile_sum = tile_max + tiles_ * rows;
  for (int64_t t = 0; t < tiles_; ++t) {
    float* lt = logits_.data() + (keep_ ? t * kFastTokenTile * rows : 0);
    HWY_DYNAMIC_DISPATCH(TileLogitsT)(block.queries_t, block.stride, rows,
                                      keys_.Rows(t * kFastTokenTile, TileCount(t), &key_tile_),
                                      TileCount(t), d, lt);
    SeenRows(visible_, 0, rows, t * kFastTokenTile, TileCount(t), seen_.data());
    // Kept logits become each tile's exp(l - m_t) in place (one exp per row and token).
    HWY_DYNAMIC_DISPATCH(TileRowStats)(lt, TileCount(t), rows, seen_.data(), tile_max + t * rows,
                                       tile_sum + t * rows, keep_ ? lt : nullptr);
  }
  CombineTiles(tile_max, tile_sum, tiles_, rows, rows, neg_max_.data(), inv_sum_.data());
  if (keep_) {  // stats_'s third part: the tiles' factors [tiles, rows]
    TileFactors(tile_max, tile_sum, tiles_, rows, rows, neg_max_.data(), inv_sum_.data(),
                tile_sum + tiles_ * rows);
  }
}

const float* RowBlockSoftmax::Probs(int64_t t) {
  const int64_t rows = block_.rows;
  float* lt = logits_.data() + (keep_ ? t * kFastTokenTile * rows : 0);
  SeenRows(visible_, 0, rows, t * kFastTokenTile, TileCount(t), seen_.data());
  if (keep_) {
    if (!converted_[t]) {  // exp(l - m_t) * exp(m_t - M) / Z
      HWY_DYNAMIC_DISPATCH(TileScaleRows)(lt, TileCount(t), rows,
                                          stats_.data() + (2 * tiles_ + t) * rows);
      converted_[t] = true;
    }
    return lt;
  }
  HWY_DYNAMIC_DISPATCH(TileLogitsT)(block_.queries_t, block_.stride, rows,
                                    keys_.Rows(t * kFastTokenTile, TileCount(t), &key_tile_),
                                    TileCount(t), d_, lt);
  HWY_DYNAMIC_DISPATCH(TileProbs)(lt, TileCount(t), rows, seen_.data(), neg_max_.data(),
                                  inv_sum_.data());
  return lt;
}

void RowBlockSoftmax::Outputs(const TokenRows& values, float* out) {
  std::fill_n(out, block_.rows * d_, 0.0f);
  for (int64_t t = 0; t < tiles_; ++t) {
    const float* probs = Probs(t);
    const float* v = values.Rows(t * kFastTokenTile, TileCount(t), &value_tile_);
    HWY_DYNAMIC_DISPATCH(TileAddPV)(probs, TileCount(t), block_.rows, v, d_, out);
  }
}

}  // namespace kvtrim

#endif  // HWY_ONCE
