// The fp32 tensors of one validated layer, as the CPU scorers read them.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "kernels/layer.h"
#include "kernels/tensor.h"

namespace kvtrim {

/// A validated layer converted to fp32 (f32 inputs are aliased, not copied), with the keys
/// and values also as they arrived (the fast kernels widen tiles of those as they read them,
/// kernels/cpu/fast/token_rows.h).
struct CpuLayer {
  int32_t layer_id = 0;
  int32_t num_layers = 1;
  LayerShape shape;
  F32Tensor keys;      // [H_kv, n, d]
  F32Tensor values;    // [H_kv, n, d] or absent
  F32Tensor queries;   // [H_q, w, d] or absent
  TensorView keys_in;    // [H_kv, n, d] as they arrived (host), or absent (tests)
  TensorView values_in;  // [H_kv, n, d] as they arrived (host), or absent
  float softmax_scale = 0;  // never 0
  uint64_t seed = 0;
  DType input_dtype = DType::kF32;  // dtype the keys arrived in
  /// Set when the engine left the keys' NaN / Inf scan to the backend: the field to name,
  /// and the flag the fast kernels raise when a key tile they read is not finite
  /// (token_rows.h).
  std::string unchecked_keys_field;
  std::shared_ptr<std::atomic<bool>> keys_nonfinite;

  /// Converts (or aliases) the tensors of `layer`. Without `widen_keys_values`, f16 / bf16
  /// keys and values are left unconverted (keys / values absent; keys_in / values_in set):
  /// for the fast kernels, which read keys_in / values_in only.
  static CpuLayer From(const ValidatedLayer& layer, bool widen_keys_values = true);
  /// Position of window query row t: n - w + t.
  int64_t QueryPosition(int64_t t) const { return shape.num_tokens - shape.window_rows + t; }
};

}  // namespace kvtrim
