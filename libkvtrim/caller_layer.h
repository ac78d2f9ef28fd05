// A layer as a libkvtrim caller hands it over (kvtrim_c.h's kvtrim_layer): pointers into the
// caller's own host or CUDA memory, never copied by the ABI itself.
#pragma once

#include <array>
#include <cstdint>

#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::inprocess {

/// One tensor in the caller's memory.
struct CallerTensor {
  const void* data = nullptr;  // null = absent
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  int device = -1;  // -1 = host memory, else the CUDA ordinal
  std::array<int64_t, 3> shape{0, 0, 0};
  std::array<int64_t, 3> strides{0, 0, 0};  // elements; all 0 = dense row-major

  /// Dense row-major: strides all 0, or exactly (shape[1] * shape[2], shape[2], 1).
  bool dense() const {
    return (strides[0] == 0 && strides[1] == 0 && strides[2] == 0) ||
           (strides[2] == 1 && strides[1] == shape[2] && strides[0] == shape[1] * shape[2]);
  }
};

/// One layer.
struct CallerLayer {
  int32_t layer_id = 0;
  float softmax_scale = 0;       // 0 = 1/sqrt(d)
  CallerTensor keys;             // [H_kv, n, d]
  CallerTensor values;           // [H_kv, n, d] or absent
  CallerTensor queries;          // [H_q, w, d] or absent
  void* output = nullptr;        // device memory for the kept lists (LayerInput.output), or null
  uint64_t output_capacity = 0;  // its bytes
};

}  // namespace kvtrim::inprocess
