// Per-token norms of values projected through a head's slice of the output projection,
// in canonical arithmetic (shared by CriticalKV and LaProx on the CPU; the GPU kernels
// reproduce them exactly).
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim {

/// ||v W_O^q||_1 = CmChunkedSum_{e < D} |CmDot(v, w_o[e, q*d : q*d + d], d)| for one value
/// row v [d]; w_o is [D, H_q * d] (o_proj.weight). `chunks` is scratch of >= ceil(D/64)
/// floats and `terms` of >= D floats.
float ProjectedL1Norm(const float* v, const float* w_o, int64_t query_head, int64_t head_dim,
                      int64_t num_query_heads, int64_t hidden, float* terms, float* chunks);

/// sqrt(max(0, v Gram v)) with y[i] = CmDot(Gram[i, :], v, d), v Gram v = CmDot(v, y, d).
/// gram is [d, d]; `y` is scratch of >= d floats.
float GramNorm(const float* v, const float* gram, int64_t head_dim, float* y);

}  // namespace kvtrim
