// Fast numerics on the CPU: per-token norms of the values projected through the model's
// output projection (CriticalKV, LaProx) and Expected Attention's quadratic logits, as
// register-blocked fp32 matrix products over tiles of kFastTokenTile tokens (the products of
// tile_ops-inl.h, SIMD chosen at run time), the row reductions fused after each block of
// columns. Work items are (KV head, tile) with fixed reduction orders: the same bits on any
// thread count. Values / keys are read as they arrived (f16 / bf16 widened per tile).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// out [H_q, prefix]: ||v_j W_O^q||_1 = sum_{e < D} |v_{h,j} . w_o[e, q*d : q*d + d]| for
/// query head q = hG + g and tokens j < prefix; w_o is o_proj.weight [D, H_q * d] fp32.
/// The products run over blocks of 256 output columns of W_O^q transposed (zero-padded to a
/// multiple of 32), each block's |.| summed per token and the blocks added in order.
void FastProjectedL1Norms(const CpuLayer& layer, const float* w_o, int64_t hidden,
                          int64_t prefix, ThreadPool& pool, float* out);

/// out [H_kv * per_head, prefix]: sqrt(max(0, v_{h,j}^T M_m v_{h,j})) for the matrices m = h *
/// per_head + i of grams [H_kv * per_head, d, d] (i < per_head: a KV head's query heads, or
/// its one group matrix) and tokens j < prefix. A positive definite M = L L^T is factored
/// once per call (fp64) and the form is |L^T v|^2, a triangular product per tile and a sum of
/// squares; any other M takes y = M v and v . y.
void FastGramNorms(const CpuLayer& layer, const float* grams, int64_t per_head, int64_t prefix,
                   ThreadPool& pool, float* out);

/// out [H_q, n]: Expected Attention's logits l_{q,j} = scale * mu_q . k_j + half_scale2 *
/// k_j^T Sigma_q k_j for every token (the quadratic form as FastGramNorms computes it, the
/// linear term as a dot product); mean [H_q, d], cov [H_q, d, d]. H_q is `num_query_heads`
/// (the statistics': the layer may carry no queries).
void FastExpectedLogits(const CpuLayer& layer, const float* mean, const float* cov,
                        int64_t num_query_heads, float scale, float half_scale2,
                        ThreadPool& pool, float* out);

}  // namespace kvtrim
