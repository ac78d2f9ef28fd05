// Fast window statistics of the model-aware scorers on the CPU (window_columns.h). The SIMD
// steps (tile_ops-inl.h) are compiled once per instruction set by Highway (foreach_target
// re-includes this file) and chosen at run time; the blocks and their sums are plain C++.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/window_columns.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <vector>

#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/row_attention.h"
#include "kernels/cpu/fast/token_rows.h"
#include "kernels/cpu/fast/window_columns.h"

namespace kvtrim {

HWY_EXPORT(TileAddScaled);
HWY_EXPORT(TileAddScaledSquares);

namespace {

/// Rows of one block that are reduced together: a query head's rows (per-head reductions)
/// or one window row's G query heads (the group sum).
struct Segment {
  int64_t block = 0;        // the block holding the rows
  int64_t slot = 0;         // query head g within the KV head (per-head reductions)
  std::vector<float> mask;  // [block rows] 1 for the segment's rows, else 0
};

/// The block geometry of one call: which column each window row takes, the segments.
struct ColumnLayout {
  int64_t block_rows = 0;  // rows per block (a multiple of 16)
  int64_t blocks = 0;      // blocks per KV head
  std::vector<int64_t> column;  // [G * window] column of (g, row) at g * window + row
  std::vector<Segment> segments;  // in block order
};

/// Per-head reductions: rows g-major (column g * window + row), blocks of RowBlockSize, a
/// segment per (block, query head) that meet.
ColumnLayout PerHeadLayout(int64_t group, int64_t window) {
  ColumnLayout out;
  const int64_t rows = group * window;
  out.block_rows = RowBlockSize(rows);
  out.blocks = (rows + out.block_rows - 1) / out.block_rows;
  out.column.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) out.column[r] = r;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / out.block_rows, g = r / window;
    if (out.segments.empty() || out.segments.back().block != b ||
        out.segments.back().slot != g) {
      out.segments.push_back({b, g, std::vector<float>(static_cast<size_t>(out.block_rows), 0)});
    }
    out.segments.back().mask[r % out.block_rows] = 1.0f;
  }
  return out;
}

/// The group sum: rows t-major, whole window rows per block (the G query heads of a row are
/// one segment): floor(B / G) rows per block of B = 16 or 32 when G <= 32, else one row per
/// block of G rounded up to 16.
ColumnLayout GroupLayout(int64_t group, int64_t window) {
  ColumnLayout out;
  out.block_rows = group > kSlabRows ? (group + 15) / 16 * 16 : RowBlockSize(group * window);
  const int64_t per_block = out.block_rows / group;
  out.blocks = (window + per_block - 1) / per_block;
  out.column.resize(static_cast<size_t>(group * window));
  for (int64_t row = 0; row < window; ++row) {
    const int64_t b = row / per_block, first = (row % per_block) * group;
    Segment segment{b, 0, std::vector<float>(static_cast<size_t>(out.block_rows), 0)};
    for (int64_t g = 0; g < group; ++g) {
      out.column[g * window + row] = b * out.block_rows + first + g;
      segment.mask[first + g] = 1.0f;
    }
    out.segments.push_back(std::move(segment));
  }
  return out;
}

}  // namespace

void FastWindowColumns(const CpuLayer& layer, int64_t window, int64_t prefix,
                       WindowReduction reduction, ThreadPool& pool, float* out) {
  const LayerShape& shape = layer.shape;
  const int64_t heads = shape.num_kv_heads, n = shape.num_tokens, d = shape.head_dim;
  const int64_t group = shape.group_size();
  const bool grouped = reduction == WindowReduction::kGroupSumSquares;
  const ColumnLayout layout = grouped ? GroupLayout(group, window) : PerHeadLayout(group, window);
  const int64_t kb = layout.block_rows;
  const int64_t padded = layout.blocks * kb;
  std::vector<float> queries_t;
  std::vector<int64_t> visible;
  WindowRowBlocks(
      layer, window, padded,
      [&](int64_t g, int64_t row) { return layout.column[g * window + row]; }, &queries_t,
      &visible);
  const TokenRows keys = TokenRows::Keys(layer);
  const bool keep = KeyTiles(n) * kFastTokenTile * kb * int64_t{sizeof(float)} <= MaxSlabBytes();
  // Partial sums [H_kv, parts, P]: one per segment (per-head) or per block (group sum).
  const int64_t parts = grouped ? layout.blocks : static_cast<int64_t>(layout.segments.size());
  std::vector<float> partial(static_cast<size_t>(heads * parts * prefix), 0.0f);
  pool.ParallelFor(heads * layout.blocks, [&](int64_t item) {
    thread_local RowBlockSoftmax softmax;
    thread_local std::vector<float> sums;
    sums.resize(static_cast<size_t>(kFastTokenTile));
    const int64_t h = item / layout.blocks, b = item % layout.blocks;
    const RowBlock block{queries_t.data() + h * d * padded + b * kb, padded, kb,
                         visible.data() + b * kb};
    softmax.Prepare(block, keys.From(h * n), n, keep);
    float* head_parts = partial.data() + h * parts * prefix;
    for (int64_t t = 0; t * kFastTokenTile < prefix; ++t) {
      const int64_t j0 = t * kFastTokenTile;
      const int64_t count = std::min(softmax.TileCount(t), prefix - j0);
      const float* probs = softmax.Probs(t);
      for (size_t s = 0; s < layout.segments.size(); ++s) {
        const Segment& segment = layout.segments[s];
        if (segment.block != b) continue;
        const float* mask = segment.mask.data();
        if (grouped) {
          HWY_DYNAMIC_DISPATCH(TileAddScaled)(probs, count, kb, mask, sums.data());
          float* part = head_parts + b * prefix + j0;
          for (int64_t j = 0; j < count; ++j) part[j] += sums[j] * sums[j];
        } else if (reduction == WindowReduction::kSumPerHead) {
          HWY_DYNAMIC_DISPATCH(TileAddScaled)(probs, count, kb, mask,
                                              head_parts + static_cast<int64_t>(s) * prefix + j0);
        } else {
          HWY_DYNAMIC_DISPATCH(TileAddScaledSquares)(
              probs, count, kb, mask, head_parts + static_cast<int64_t>(s) * prefix + j0);
        }
      }
    }
  });
  // The partials added in block order.
  const int64_t slots = grouped ? 1 : group;
  std::fill_n(out, heads * slots * prefix, 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t slot = grouped ? 0 : layout.segments[p].slot;
      float* dst = out + (h * slots + slot) * prefix;
      const float* src = partial.data() + (h * parts + p) * prefix;
      for (int64_t j = 0; j < prefix; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace kvtrim

#endif  // HWY_ONCE
