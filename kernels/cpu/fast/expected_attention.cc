// Fast Expected Attention scores on the CPU (expected_attention.h). The SIMD steps
// (tile_ops-inl.h) are compiled once per instruction set by Highway (foreach_target
// re-includes this file) and chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/expected_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "kernels/cpu/fast/tile_ops-inl.h"

#if HWY_ONCE

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/fast/expected_attention.h"
#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/token_rows.h"
#include "kernels/cpu/fast/value_norms.h"

namespace kvtrim {

HWY_EXPORT(RowMaxExpSum);
HWY_EXPORT(RowAddProbs);
HWY_EXPORT(TileSquaredNorms);

namespace {

/// One tile of a row of logits in a buffer of kFastTokenTile (a multiple of every target's
/// vector; the lanes past count are 0 and masked out by the SIMD steps).
const float* PaddedTile(const float* logits, int64_t count, std::vector<float>* tile) {
  tile->resize(static_cast<size_t>(kFastTokenTile));
  std::copy_n(logits, count, tile->begin());
  std::fill(tile->begin() + count, tile->end(), 0.0f);
  return tile->data();
}

}  // namespace

void FastExpectedAttentionScores(const CpuLayer& layer, const ExpectedQueryStats& stats,
                                 float eps, bool use_vnorm, ThreadPool& pool, float* scores) {
  const LayerShape& shape = layer.shape;
  // H_q from the statistics [H_q, d]: queries are optional (0 query heads without them).
  const int64_t n = shape.num_tokens;
  const int64_t hq = static_cast<int64_t>(stats.mean.size()) / shape.head_dim;
  const int64_t heads = shape.num_kv_heads, group = hq / heads;
  const int64_t tiles = KeyTiles(n);
  std::vector<float> logits(static_cast<size_t>(hq * n));
  FastExpectedLogits(layer, stats.mean.data(), stats.cov.data(), hq, layer.softmax_scale,
                     stats.half_scale2, pool, logits.data());
  // Per (query head, tile): the maximum and sum of exp; then per query head -M and 1 / Z.
  std::vector<float> tile_max(static_cast<size_t>(hq * tiles)), tile_sum(tile_max.size());
  pool.ParallelFor(hq * tiles, [&](int64_t item) {
    thread_local std::vector<float> tile;
    const int64_t q = item / tiles, j0 = (item % tiles) * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, n - j0);
    const float* x = PaddedTile(logits.data() + q * n + j0, count, &tile);
    HWY_DYNAMIC_DISPATCH(RowMaxExpSum)(x, count, &tile_max[item], &tile_sum[item]);
  });
  std::vector<float> neg_max(static_cast<size_t>(hq)), inv_sum(neg_max.size());
  for (int64_t q = 0; q < hq; ++q) {
    CombineTiles(tile_max.data() + q * tiles, tile_sum.data() + q * tiles, tiles, 1, 1,
                 &neg_max[q], &inv_sum[q]);
  }
  const TokenRows values = TokenRows::Values(layer);
  const float inv_group = 1.0f / static_cast<float>(group);
  pool.ParallelFor(heads * tiles, [&](int64_t item) {
    thread_local std::vector<float> tile, acc, norms, widened;
    const int64_t h = item / tiles, j0 = (item % tiles) * kFastTokenTile;
    const int64_t count = std::min(kFastTokenTile, n - j0);
    acc.assign(static_cast<size_t>(kFastTokenTile), 0.0f);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t q = h * group + g;
      const float* x = PaddedTile(logits.data() + q * n + j0, count, &tile);
      HWY_DYNAMIC_DISPATCH(RowAddProbs)(x, count, neg_max[q], inv_sum[q], acc.data());
    }
    norms.resize(static_cast<size_t>(kFastTokenTile));
    if (use_vnorm) {
      HWY_DYNAMIC_DISPATCH(TileSquaredNorms)(values.Rows(h * n + j0, count, &widened), count,
                                             shape.head_dim, norms.data());
    }
    float* out = scores + h * n + j0;
    for (int64_t j = 0; j < count; ++j) {
      const float ea = acc[j] * inv_group + eps;
      out[j] = use_vnorm ? ea * std::sqrt(norms[j]) : ea;
    }
  });
}

}  // namespace kvtrim

#endif  // HWY_ONCE
