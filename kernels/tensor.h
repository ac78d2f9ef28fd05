// Views over the tensors of one layer request: raw input views and fp32 views.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/dtype.h"

namespace kvtrim {

/// A read-only view over a dense, row-major rank-3 tensor in any input dtype.
/// `data == nullptr` means "not provided". The view does not own its bytes.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::array<int64_t, 3> shape{0, 0, 0};  // [dim0, dim1, dim2]

  /// True when the tensor was provided.
  bool present() const { return data != nullptr; }
  /// Number of elements.
  int64_t numel() const { return shape[0] * shape[1] * shape[2]; }
  /// Number of bytes the elements occupy.
  int64_t nbytes() const { return numel() * static_cast<int64_t>(DTypeSize(dtype)); }
};

/// A read-only fp32 rank-3 tensor [dim0, dim1, dim2], row-major. It either aliases
/// caller memory (f32 input) or owns a converted copy (f16/bf16 input).
class F32Tensor {
 public:
  F32Tensor() = default;

  /// Wraps `view`: aliases it when it is f32, otherwise converts it into owned storage.
  static F32Tensor FromView(const TensorView& view);

  /// Owns `values` laid out as `shape` (used by tests and benchmarks).
  static F32Tensor Owning(std::vector<float> values, std::array<int64_t, 3> shape);

  bool present() const { return data_ != nullptr; }
  const float* data() const { return data_; }
  int64_t dim(int i) const { return shape_[i]; }
  const std::array<int64_t, 3>& shape() const { return shape_; }

  /// Pointer to row [i0, i1, :] (dim2 contiguous floats).
  const float* row(int64_t i0, int64_t i1) const {
    return data_ + (i0 * shape_[1] + i1) * shape_[2];
  }

 private:
  const float* data_ = nullptr;
  std::array<int64_t, 3> shape_{0, 0, 0};
  std::shared_ptr<std::vector<float>> owned_;
};

}  // namespace kvtrim
