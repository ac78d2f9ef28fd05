#include "kernels/cpu/projected_norms.h"

#include "kernels/canonical_math.h"

namespace kvtrim {

float ProjectedL1Norm(const float* v, const float* w_o, int64_t query_head, int64_t head_dim,
                      int64_t num_query_heads, int64_t hidden, float* terms, float* chunks) {
  const int64_t stride = num_query_heads * head_dim;
  for (int64_t e = 0; e < hidden; ++e) {
    const float dot = CmDot(v, w_o + e * stride + query_head * head_dim, static_cast<int>(head_dim));
    terms[e] = dot < 0.0f ? -dot : dot;
  }
  return CmChunkedSum(terms, hidden, chunks);
}

float GramNorm(const float* v, const float* gram, int64_t head_dim, float* y) {
  const int d = static_cast<int>(head_dim);
  for (int64_t i = 0; i < head_dim; ++i) y[i] = CmDot(gram + i * head_dim, v, d);
  const float quad = CmDot(v, y, d);
  return CmSqrt(quad > 0.0f ? quad : 0.0f);
}

}  // namespace kvtrim
