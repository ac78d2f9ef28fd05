#include "kernels/cpu/window_attention.h"

#include <algorithm>
#include <limits>

#include "kernels/scorer_params.h"

namespace kvtrim {

int64_t VisibleTokens(const CpuLayer& layer, int64_t t) {
  return std::clamp<int64_t>(layer.QueryPosition(t) + 1, 0, layer.shape.num_tokens);
}

void TreeSumRows(float* x, int64_t m, int64_t width) {
  while (m > 1) {
    const int64_t half = m / 2;
    for (int64_t r = 0; r < half; ++r) {
      float* dst = x + r * width;
      const float* left = x + 2 * r * width;
      const float* right = left + width;
      for (int64_t i = 0; i < width; ++i) dst[i] = CmAdd(left[i], right[i]);
    }
    if (m % 2) std::copy(x + (m - 1) * width, x + m * width, x + half * width);
    m = half + (m % 2);
  }
}

namespace {

// Resizes `v` to at least `size` elements (never shrinks: scratch is reused across rows).
void Reserve(std::vector<float>& v, int64_t size) {
  if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
}

}  // namespace

AttentionRowStats ComputeAttentionRow(const CpuLayer& layer, int64_t q_head, int64_t t,
                                      float* output, AttentionRowScratch* scratch) {
  const int64_t n = layer.shape.num_tokens;
  const int64_t d = layer.shape.head_dim;
  const int kd = static_cast<int>(d);
  const int64_t kv_head = q_head / layer.shape.group_size();
  const float* q = layer.queries.row(q_head, t);
  const float scale = layer.softmax_scale;

  AttentionRowStats stats;
  stats.visible = VisibleTokens(layer, t);
  if (output != nullptr) std::fill(output, output + d, 0.0f);
  const int64_t visible = stats.visible;
  if (visible == 0) return stats;

  const int64_t num_segments = (visible + kAttnSegment - 1) / kAttnSegment;
  const int64_t out_width = output != nullptr ? d : 0;
  AttentionRowScratch& s = *scratch;
  Reserve(s.logits, n);
  Reserve(s.exps, kAttnSegment);
  Reserve(s.seg_max, num_segments);
  Reserve(s.seg_sum, num_segments);
  Reserve(s.seg_out, num_segments * out_width);
  Reserve(s.chunk_sum, kAttnChunksPerSegment);
  Reserve(s.chunk_out, kAttnChunksPerSegment * out_width);
  float* logits = s.logits.data();

  // Step 1: logits.
  for (int64_t j = 0; j < visible; ++j) {
    logits[j] = CmMul(CmDot(q, layer.keys.row(kv_head, j), kd), scale);
  }

  // Step 2: per segment, the local maximum, chunk sums and the segment's tree sums.
  for (int64_t seg = 0; seg < num_segments; ++seg) {
    const int64_t lo = seg * kAttnSegment;
    const int64_t hi = std::min(lo + kAttnSegment, visible);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = lo; j < hi; ++j) m = std::max(m, logits[j]);
    float* e = s.exps.data();
    for (int64_t j = lo; j < hi; ++j) e[j - lo] = CmExp(CmAdd(logits[j], -m));

    const int64_t num_chunks = (hi - lo + kAttnChunk - 1) / kAttnChunk;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int64_t c_lo = lo + c * kAttnChunk;
      const int64_t c_hi = std::min(c_lo + kAttnChunk, hi);
      float z = 0.0f;
      for (int64_t j = c_lo; j < c_hi; ++j) z = CmAdd(z, e[j - lo]);
      s.chunk_sum[c] = z;
      if (output != nullptr) {
        float* acc = s.chunk_out.data() + c * d;
        std::fill(acc, acc + d, 0.0f);
        for (int64_t j = c_lo; j < c_hi; ++j) {
          const float ej = e[j - lo];
          const float* v = layer.values.row(kv_head, j);
          for (int64_t i = 0; i < d; ++i) acc[i] = CmAdd(acc[i], CmMul(ej, v[i]));
        }
      }
    }
    s.seg_max[seg] = m;
    s.seg_sum[seg] = CmTreeSum(s.chunk_sum.data(), num_chunks);
    if (output != nullptr) {
      TreeSumRows(s.chunk_out.data(), num_chunks, d);
      std::copy(s.chunk_out.data(), s.chunk_out.data() + d, s.seg_out.data() + seg * d);
    }
  }

  // Step 3: combine the segments, rescaled to the row maximum.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t seg = 0; seg < num_segments; ++seg) max_logit = std::max(max_logit, s.seg_max[seg]);
  for (int64_t seg = 0; seg < num_segments; ++seg) {
    const float f = CmExp(CmAdd(s.seg_max[seg], -max_logit));
    s.seg_sum[seg] = CmMul(s.seg_sum[seg], f);
    if (output != nullptr) {
      float* o = s.seg_out.data() + seg * d;
      for (int64_t i = 0; i < d; ++i) o[i] = CmMul(o[i], f);
    }
  }
  const float sum = CmTreeSum(s.seg_sum.data(), num_segments);
  stats.neg_max = -max_logit;
  stats.inv_sum = CmDiv(1.0f, sum);
  if (output != nullptr) {
    TreeSumRows(s.seg_out.data(), num_segments, d);
    for (int64_t i = 0; i < d; ++i) output[i] = CmDiv(s.seg_out[i], sum);
  }
  return stats;
}

}  // namespace kvtrim
