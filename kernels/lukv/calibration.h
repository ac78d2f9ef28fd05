// In-memory calibration data of LU-KV profiling (lukv.md §5.2): one dump per calibration
// question (full-sequence post-RoPE keys, values and queries of every layer) and the
// model's output projections W_O.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace kvtrim::lukv {

/// Dimensions of one calibration dump. Positions 0..T-1 are the context (what the
/// sidecar compresses), T..S-1 the question, S..N-1 the answer (the decode steps).
struct CalibrationDims {
  int64_t num_layers = 0;       // L
  int64_t num_kv_heads = 0;     // H_kv
  int64_t num_query_heads = 0;  // H_q (a multiple of H_kv)
  int64_t head_dim = 0;         // d
  int64_t num_tokens = 0;       // N
  int64_t context_length = 0;   // T
  int64_t decode_start = 0;     // S, with T <= S < N

  /// G = H_q / H_kv.
  int64_t group_size() const { return num_kv_heads ? num_query_heads / num_kv_heads : 0; }
  /// INVALID_ARGUMENT naming `source` unless every dimension is positive, H_q % H_kv == 0
  /// and 1 <= T <= S < N.
  absl::Status Validate(const std::string& source) const;
};

/// One calibration dump: per layer keys [H_kv, N, d], values [H_kv, N, d] (keys post-RoPE)
/// and queries [H_q, N, d] (post-RoPE, every position). The tensors may alias `owner`.
struct CalibrationDump {
  std::string source;  // file name, for messages
  CalibrationDims dims;
  std::vector<F32Tensor> keys;     // [L] of [H_kv, N, d]
  std::vector<F32Tensor> values;   // [L] of [H_kv, N, d]
  std::vector<F32Tensor> queries;  // [L] of [H_q, N, d]
  float softmax_scale = 0;         // 0 = 1/sqrt(d)
  std::shared_ptr<const void> owner;  // keeps aliased bytes alive

  /// Validate() of dims plus the presence and shape of every layer's tensors.
  absl::Status Validate() const;
};

/// The model weights the oracle reads: per layer o_proj.weight W [D, H_q * d] (HF layout,
/// y = x Wᵀ), so W_O^{(g)} = W[:, g·d:(g+1)·d]ᵀ is [d, D].
struct ModelWeights {
  std::string name;
  int64_t num_layers = 0;       // L
  int64_t num_query_heads = 0;  // H_q
  int64_t num_kv_heads = 0;     // H_kv
  int64_t head_dim = 0;         // d
  int64_t hidden_size = 0;      // D
  std::vector<F32Tensor> w_o;   // [L] of [1, D, H_q * d]
  std::shared_ptr<const void> owner;  // keeps aliased bytes alive

  /// INVALID_ARGUMENT unless the layout is consistent and every w_o is [1, D, H_q*d].
  absl::Status Validate() const;
  /// INVALID_ARGUMENT naming the dump unless its L, H_kv, H_q and d match the model's.
  absl::Status CheckMatches(const CalibrationDims& dims, const std::string& source) const;
};

}  // namespace kvtrim::lukv
