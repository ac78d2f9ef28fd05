// The fp32 tensors of one validated layer, as the CPU scorers read them.
#pragma once

#include "kernels/layer.h"
#include "kernels/tensor.h"

namespace kvtrim {

/// A validated layer converted to fp32 (f32 inputs are aliased, not copied).
struct CpuLayer {
  int32_t layer_id = 0;
  int32_t num_layers = 1;
  LayerShape shape;
  F32Tensor keys;      // [H_kv, n, d]
  F32Tensor values;    // [H_kv, n, d] or absent
  F32Tensor queries;   // [H_q, w, d] or absent
  float softmax_scale = 0;  // never 0
  uint64_t seed = 0;
  DType input_dtype = DType::kF32;  // dtype the keys arrived in

  /// Converts (or aliases) the tensors of `layer`.
  static CpuLayer From(const ValidatedLayer& layer);
  /// Position of window query row t: n - w + t.
  int64_t QueryPosition(int64_t t) const { return shape.num_tokens - shape.window_rows + t; }
};

}  // namespace kvtrim
