// Views over the tensors of one layer request: raw input views and fp32 views.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/dtype.h"

namespace kvtrim {

/// Where a tensor's bytes live.
///  kHost    process memory, readable by the CPU
///  kDevice  CUDA device memory of the backend's device (a mapped CUDA IPC region); only a
///           backend whose reads_device_memory() is true takes such tensors
///  kPinnedHost  host memory page-locked for the devices (a worker's host shm segment,
///           mapped, or a pooled buffer a session's chunks were received into): the device
///           copies it by DMA, and nothing on the host reads it, since the worker may shrink
///           its segment (a host read would fault); only a backend
///           whose reads_device_memory() is true takes such tensors, and it checks them for
///           NaN / Inf on the device as it does device tensors
enum class MemorySpace { kHost, kDevice, kPinnedHost };

/// Element addresses of a device tensor that is not dense row-major (a worker's own KV
/// layout, e.g. a paged pool). Element [i0, i1, i2] sits at element offset
///   i0 * strides[0] + token(i1) + i2 * strides[2]   from TensorView::data, where
///   token(i1) = i1 * strides[1]                                   (block_tokens == 0)
///   token(i1) = block_table[i1 / block_tokens] * block_stride
///               + (i1 % block_tokens) * strides[1]                (paged)
/// The decoder has checked that every addressed element lies inside its region.
struct StridedLayout {
  std::array<int64_t, 3> strides{0, 0, 0};  // elements, each >= 1
  int64_t block_tokens = 0;                 // B; 0 = not paged
  int64_t block_stride = 0;                 // elements between consecutive pool blocks
  std::vector<int32_t> block_table;         // [ceil(dim1 / B)] pool block of each run
};

/// A read-only view over a rank-3 tensor in any input dtype: dense row-major unless
/// `layout` is set (device tensors only; host tensors are always dense).
/// `data == nullptr` means "not provided". The view does not own its bytes.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::array<int64_t, 3> shape{0, 0, 0};  // [dim0, dim1, dim2]
  MemorySpace space = MemorySpace::kHost;
  std::shared_ptr<const StridedLayout> layout = nullptr;  // null = dense row-major

  /// True when the bytes are in device memory.
  bool on_device() const { return space == MemorySpace::kDevice; }
  /// True when host code may read the bytes (kHost); device and pinned host tensors are
  /// read by the device only.
  bool host_readable() const { return space == MemorySpace::kHost; }

  /// True when the tensor was provided.
  bool present() const { return data != nullptr; }
  /// Number of elements.
  int64_t numel() const { return shape[0] * shape[1] * shape[2]; }
  /// Number of bytes the elements occupy.
  int64_t nbytes() const { return numel() * static_cast<int64_t>(DTypeSize(dtype)); }
};

/// INVALID_ARGUMENT "<field>: contains NaN at [a, b, c]" (or Inf, from `value`) for the
/// element at row-major flat index `flat_index` of `t`: the one message of the host and the
/// device NaN / Inf checks.
absl::Status NonFiniteError(const std::string& field, const TensorView& t, int64_t flat_index,
                            float value);

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
