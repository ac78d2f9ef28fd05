#include "kernels/cpu/fast/fast_perturbation.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/fast/row_attention.h"
#include "kernels/cpu/fast/token_rows.h"

namespace kvtrim {

namespace {

/// Per-thread buffers of one (head, row block) item.
struct PerturbationScratch {
  RowBlockSoftmax softmax;
  std::vector<float> full, kept;              // [block, d] the rows' outputs
  std::vector<float> kept_keys, kept_values;  // [k, d] the head's kept tokens, gathered
  std::vector<int64_t> kept_tokens;           // [k] their token ids, ascending
  std::vector<int64_t> kept_visible;          // [block] kept tokens each row sees
  std::vector<char> mask;                     // [n] 1 = kept
};

/// ||a_kept - a_full|| / ||a_full|| of one row in fp64, with OutputPerturbation's edge cases
/// (a_full = 0: 0 when a_kept = 0 too, else 1; a row seeing no kept token has a_kept = 0).
double RowRatio(const float* full, const float* kept, int64_t d) {
  double full_sq = 0, kept_sq = 0, diff_sq = 0;
  for (int64_t i = 0; i < d; ++i) {
    const double f = full[i], k = kept[i];
    full_sq += f * f;
    kept_sq += k * k;
    diff_sq += (k - f) * (k - f);
  }
  if (full_sq == 0) return kept_sq == 0 ? 0.0 : 1.0;
  return std::sqrt(diff_sq / full_sq);
}

}  // namespace

void FastOutputPerturbation(const CpuLayer& layer, const std::vector<int64_t>& offsets,
                            const std::vector<int32_t>& kept, int64_t rows_per_head,
                            ThreadPool& pool, double* out, const float* full_outputs) {
  const LayerShape& shape = layer.shape;
  const int64_t heads = shape.num_kv_heads;
  const int64_t n = shape.num_tokens;
  const int64_t d = shape.head_dim;
  const int64_t w = shape.window_rows;
  const int64_t group = shape.group_size();
  const int64_t per_head = std::min(rows_per_head, w);
  if (!shape.has_values || !layer.queries.present() || group < 1 || per_head < 1 ||
      offsets.size() < 2) {
    std::fill(out, out + heads, 0.0);
    return;
  }
  const int64_t rows = group * per_head;
  const int64_t block = RowBlockSize(rows);
  const int64_t padded = (rows + block - 1) / block * block;
  const int64_t blocks = padded / block;
  std::vector<int64_t> visible;  // [padded] V_r
  std::vector<float> queries_t;  // [H_kv, d, padded]
  WindowRowBlocks(layer, per_head, padded, &queries_t, &visible);
  const bool slab = KeyTiles(n) * kFastTokenTile * block * 4 <= MaxSlabBytes();
  const bool shared = offsets.size() == 2;
  std::vector<double> partial(static_cast<size_t>(heads * blocks), 0.0);
  pool.ParallelFor(heads * blocks, [&](int64_t item) {
    thread_local PerturbationScratch s;
    const int64_t h = item / blocks;
    const int64_t r0 = (item % blocks) * block;
    const TokenRows keys = TokenRows::Keys(layer).From(h * n);
    const TokenRows values = TokenRows::Values(layer).From(h * n);
    s.full.resize(static_cast<size_t>(block * d));
    s.kept.assign(static_cast<size_t>(block * d), 0.0f);
    // The full outputs: the scorer's, or a run over every token.
    const float* qt = queries_t.data() + h * d * padded + r0;
    if (full_outputs != nullptr) {
      const int64_t real = std::min(block, rows - r0);
      std::copy_n(full_outputs + (h * rows + r0) * d, real * d, s.full.data());
    } else {
      s.softmax.Prepare({qt, padded, block, visible.data() + r0}, keys, n, slab);
      s.softmax.Outputs(values, s.full.data());
    }
    // The kept tokens of the head's list (in range, each once, ascending), gathered.
    const int64_t list = shared ? 0 : h;
    s.mask.assign(static_cast<size_t>(n), 0);
    for (int64_t i = offsets[list]; i < offsets[list + 1]; ++i) {
      if (kept[i] >= 0 && kept[i] < n) s.mask[kept[i]] = 1;
    }
    s.kept_tokens.clear();
    for (int64_t j = 0; j < n; ++j) {
      if (s.mask[j]) s.kept_tokens.push_back(j);
    }
    const int64_t k = static_cast<int64_t>(s.kept_tokens.size());
    if (k > 0) {
      s.kept_keys.resize(static_cast<size_t>(k * d));
      s.kept_values.resize(static_cast<size_t>(k * d));
      for (int64_t i = 0; i < k; ++i) {
        keys.CopyRows(s.kept_tokens[i], 1, s.kept_keys.data() + i * d);
        values.CopyRows(s.kept_tokens[i], 1, s.kept_values.data() + i * d);
      }
      // Row r sees the kept tokens j < V_r: a prefix of the ascending list.
      s.kept_visible.resize(static_cast<size_t>(block));
      for (int64_t r = 0; r < block; ++r) {
        s.kept_visible[r] = std::lower_bound(s.kept_tokens.begin(), s.kept_tokens.end(),
                                             visible[r0 + r]) -
                            s.kept_tokens.begin();
      }
      s.softmax.Prepare({qt, padded, block, s.kept_visible.data()},
                        {s.kept_keys.data(), DType::kF32, d}, k, slab);
      s.softmax.Outputs({s.kept_values.data(), DType::kF32, d}, s.kept.data());
    }
    double total = 0;  // the block's real rows, in order
    for (int64_t r = 0; r < block && r0 + r < rows; ++r) {
      total += RowRatio(s.full.data() + r * d, s.kept.data() + r * d, d);
    }
    partial[item] = total;
  });
  for (int64_t h = 0; h < heads; ++h) {
    double total = 0;
    for (int64_t b = 0; b < blocks; ++b) total += partial[h * blocks + b];
    out[h] = total / static_cast<double>(rows);
  }
}

}  // namespace kvtrim
