// Fast DropKV eviction cost on the CPU (dropkv_cost.h). The SIMD steps (tile_ops-inl.h) are
// compiled once per instruction set by Highway (foreach_target re-includes this file) and
// chosen at run time; the sweeps around them are plain C++.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/dropkv_cost.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <vector>

#include "kernels/cpu/fast/dropkv_cost.h"
#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/row_attention.h"

namespace kvtrim {

HWY_EXPORT(TileLogitsT);
HWY_EXPORT(TileSquaredNorms);
HWY_EXPORT(TileDropKVCost);

namespace {

/// The fixed geometry of one call: row blocks, their visibility, the scaled queries.
struct DropKVPasses {
  int64_t n = 0, d = 0;
  int64_t rows = 0;              // the real rows, G * window
  int64_t block = 0;             // rows per work item (RowBlockSize)
  int64_t padded_rows = 0;       // the rows rounded up to whole blocks (zero rows past them)
  std::vector<int64_t> visible;  // [padded_rows] V_r (0 for the padding)
  std::vector<float> queries_t;  // [H_kv, d, padded_rows] scale * q, transposed
  TokenRows keys, values;        // [H_kv, n, d] as they arrived
  bool slab = false;             // keep a block's logits over all tokens (else recompute)
  float eps = 0;
  bool round_bf16 = false;
};

/// Per-thread buffers of one (head, row block) item, reused across items and calls.
struct DropKVScratch {
  RowBlockSoftmax softmax;
  std::vector<float> out;     // [block, d] a_r
  std::vector<float> out_t;   // [d, block] a_r transposed
  std::vector<float> out_sq;  // [block] |a_r|^2
  std::vector<float> dots;    // [kFastTokenTile, block] a_r . v_j
  std::vector<float> v_sq;    // [kFastTokenTile] |v_j|^2
  std::vector<float> v_tile;  // [kFastTokenTile, d] widened values
};

/// Adds the cost terms of rows [r0, r0 + block) of head h into partial [n]; copies the real
/// rows' outputs to `outputs` [rows, d] of the head when not null.
void CostItem(const DropKVPasses& p, int64_t h, int64_t r0, float* partial, float* outputs) {
  thread_local DropKVScratch s;
  const int64_t kb = p.block;
  const int64_t d = p.d;
  s.out.resize(static_cast<size_t>(kb * d));
  s.out_t.resize(static_cast<size_t>(d * kb));
  s.out_sq.resize(static_cast<size_t>(kb));
  s.dots.resize(static_cast<size_t>(kFastTokenTile * kb));
  s.v_sq.resize(static_cast<size_t>(kFastTokenTile));
  const RowBlock block{p.queries_t.data() + h * d * p.padded_rows + r0, p.padded_rows, kb,
                       p.visible.data() + r0};
  const TokenRows values = p.values.From(h * p.n);
  s.softmax.Prepare(block, p.keys.From(h * p.n), p.n, p.slab);
  s.softmax.Outputs(values, s.out.data());
  if (outputs != nullptr) {
    const int64_t real = std::min(kb, p.rows - r0);
    std::copy_n(s.out.data(), real * d, outputs + r0 * d);
  }
  for (int64_t r = 0; r < kb; ++r) {
    float sq = 0;
    for (int64_t i = 0; i < d; ++i) {
      const float x = s.out[r * d + i];
      s.out_t[i * kb + r] = x;
      sq += x * x;
    }
    s.out_sq[r] = sq;
  }
  // a . v per token and row, and the cost terms.
  for (int64_t t = 0; t < s.softmax.tiles(); ++t) {
    const float* probs = s.softmax.Probs(t);
    const int64_t count = s.softmax.TileCount(t);
    const float* v = values.Rows(t * kFastTokenTile, count, &s.v_tile);
    HWY_DYNAMIC_DISPATCH(TileLogitsT)(s.out_t.data(), kb, kb, v, count, d, s.dots.data());
    HWY_DYNAMIC_DISPATCH(TileSquaredNorms)(v, count, d, s.v_sq.data());
    HWY_DYNAMIC_DISPATCH(TileDropKVCost)(probs, s.dots.data(), count, kb, s.softmax.Seen(),
                                         s.out_sq.data(), s.v_sq.data(), p.eps, p.round_bf16,
                                         partial + t * kFastTokenTile);
  }
}

}  // namespace

void FastDropKVCost(const CpuLayer& layer, int64_t window, float eps, bool round_bf16,
                    ThreadPool& pool, float* cost, float* row_outputs) {
  const LayerShape& shape = layer.shape;
  DropKVPasses p;
  const int64_t heads = shape.num_kv_heads;
  p.n = shape.num_tokens;
  p.d = shape.head_dim;
  p.keys = TokenRows::Keys(layer);
  p.values = TokenRows::Values(layer);
  p.eps = eps;
  p.round_bf16 = round_bf16;
  const int64_t rows = p.rows = shape.group_size() * window;
  // The head's rows' outputs, when asked for.
  const auto outputs_of = [&](int64_t h) {
    return row_outputs == nullptr ? nullptr : row_outputs + h * rows * p.d;
  };
  p.block = RowBlockSize(rows);
  p.padded_rows = (rows + p.block - 1) / p.block * p.block;
  p.slab = KeyTiles(p.n) * kFastTokenTile * p.block * 4 <= MaxSlabBytes();
  WindowRowBlocks(layer, window, p.padded_rows, &p.queries_t, &p.visible);
  const int64_t blocks = p.padded_rows / p.block;
  if (blocks == 1) {  // one item per head: its terms go straight into the output
    std::fill_n(cost, heads * p.n, 0.0f);
    pool.ParallelFor(heads,
                     [&](int64_t h) { CostItem(p, h, 0, cost + h * p.n, outputs_of(h)); });
    return;
  }
  std::vector<float> partial(static_cast<size_t>(heads * blocks * p.n), 0.0f);
  pool.ParallelFor(heads * blocks, [&](int64_t item) {
    CostItem(p, item / blocks, (item % blocks) * p.block, partial.data() + item * p.n,
             outputs_of(item / blocks));
  });
  for (int64_t h = 0; h < heads; ++h) {  // the blocks' costs, in block order
    float* out = cost + h * p.n;
    std::copy_n(partial.data() + h * blocks * p.n, p.n, out);
    for (int64_t b = 1; b < blocks; ++b) {
      const float* part = partial.data() + (h * blocks + b) * p.n;
      for (int64_t j = 0; j < p.n; ++j) out[j] += part[j];
    }
  }
}

}  // namespace kvtrim

#endif  // HWY_ONCE
