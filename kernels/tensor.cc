#include "kernels/tensor.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtrim {

absl::Status NonFiniteError(const std::string& field, const TensorView& t, int64_t flat_index,
                            float value) {
  const int64_t a = flat_index / (t.shape[1] * t.shape[2]);
  const int64_t b = (flat_index / t.shape[2]) % t.shape[1];
  const int64_t c = flat_index % t.shape[2];
  return absl::InvalidArgumentError(absl::StrCat(field, ": contains ",
                                                 std::isnan(value) ? "NaN" : "Inf", " at [", a,
                                                 ", ", b, ", ", c, "]"));
}

F32Tensor F32Tensor::FromView(const TensorView& view) {
  F32Tensor t;
  t.shape_ = view.shape;
  if (!view.present()) return t;
  if (view.dtype == DType::kF32) {
    t.data_ = static_cast<const float*>(view.data);
    return t;
  }
  t.owned_ = std::make_shared<std::vector<float>>(static_cast<size_t>(view.numel()));
  ConvertToF32(view.dtype, view.data, t.owned_->size(), t.owned_->data());
  t.data_ = t.owned_->data();
  return t;
}

F32Tensor F32Tensor::Owning(std::vector<float> values, std::array<int64_t, 3> shape) {
  F32Tensor t;
  t.shape_ = shape;
  t.owned_ = std::make_shared<std::vector<float>>(std::move(values));
  t.data_ = t.owned_->data();
  return t;
}

}  // namespace kvtrim
