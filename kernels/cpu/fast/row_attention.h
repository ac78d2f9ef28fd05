// Fast numerics on the CPU: causal softmax attention of one block of window rows over a run
// of tokens, in fp32 with SIMD chosen at run time (tile_ops-inl.h) -- the step DropKV's
// cost and the fast perturbation statistic share.
//
// For the block's rows r (query q_r, scaled by the softmax scale) and tokens j < V_r of
// keys / values [m, d]:
//   p_{r,j} = exp(q_r . k_j - M_r) / Z_r,  a_r = sum_j p_{r,j} v_j.
// The tokens are read in tiles of kFastTokenTile; a row's maximum and sum of exp are found
// per tile and combined in tile order (Z in fp64); a_r is summed per tile in registers,
// then over the tiles in order. Fixed order everywhere: the same bits on any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/fast/token_rows.h"

namespace kvtrim {

/// One block of window rows: scaled queries transposed, and what each row sees.
struct RowBlock {
  const float* queries_t = nullptr;  // column r of [d, stride] = scale * q_r
  int64_t stride = 0;                // floats between the rows of queries_t
  int64_t rows = 0;                  // 16 or 32 (zero columns / visible 0 pad the block)
  const int64_t* visible = nullptr;  // [rows] tokens each row sees (a prefix of the run)
};

/// The last `rows_per_head` window rows of every query head of `layer` as row blocks:
/// queries_t [H_kv, d, padded] (column r = g * rows_per_head + t - (w - rows_per_head) of KV
/// head h holds scale * q_{hG+g, t}; zero columns pad to `padded`), visible [padded] the
/// tokens each row sees (0 for the padding). DropKV's cost and the statistic share it.
void WindowRowBlocks(const CpuLayer& layer, int64_t rows_per_head, int64_t padded,
                     std::vector<float>* queries_t, std::vector<int64_t>* visible);
/// The same rows in any order: query head g's row t - (w - rows_per_head) of every KV head
/// goes to column column(g, t - (w - rows_per_head)) < padded (a one-to-one map).
void WindowRowBlocks(const CpuLayer& layer, int64_t rows_per_head, int64_t padded,
                     const std::function<int64_t(int64_t g, int64_t row)>& column,
                     std::vector<float>* queries_t, std::vector<int64_t>* visible);

/// Rows per block for `rows` real rows: 16 up to 16 rows, else 32 (a multiple of every
/// target's two vectors and of 4).
int64_t RowBlockSize(int64_t rows);

/// The softmax of one block over one run of m tokens, with the per-tile buffers it needs.
/// One per thread; reused across blocks (Prepare starts over).
class RowBlockSoftmax {
 public:
  /// Sweep 1: each row's maximum and sum of exp over keys [m, d] (any dtype, widened a tile
  /// at a time). With `keep`, each tile's exp(l - m_t) stays (a [m, rows] slab) and Probs
  /// scales it by exp(m_t - M) / Z, else the logits are recomputed per tile. `keys` must
  /// outlive the sweeps.
  void Prepare(const RowBlock& block, const TokenRows& keys, int64_t m, bool keep);
  /// Number of tiles of the run, and the tokens in tile t.
  int64_t tiles() const { return tiles_; }
  int64_t TileCount(int64_t t) const;
  /// The probabilities of tile t, [TileCount(t), rows] token-major, 0 where a row does not
  /// see the token; also sets Seen() to what each row sees of the tile. Valid until the next
  /// call (without `keep`).
  const float* Probs(int64_t t);
  /// [rows] tokens of the last tile Probs returned that each row sees (floats).
  const float* Seen() const { return seen_.data(); }
  /// out [rows, d] = a_r = P.V over the run, values [m, d] (any dtype).
  void Outputs(const TokenRows& values, float* out);

 private:
  RowBlock block_;
  TokenRows keys_;
  int64_t m_ = 0, d_ = 0, tiles_ = 0;
  bool keep_ = false;
  std::vector<float> logits_;    // [tiles or 1, kFastTokenTile, rows] logits / exp / p
  std::vector<bool> converted_;  // [tiles] slab tiles already scaled into probabilities
  std::vector<float> stats_;  // tile max, tile sum, factors (keep): each [tiles, rows]
  std::vector<float> neg_max_, inv_sum_, seen_;  // [rows]
  std::vector<int64_t> visible_;                 // [rows]
  std::vector<float> key_tile_, value_tile_;     // [kFastTokenTile, d] widened rows
};

}  // namespace kvtrim
