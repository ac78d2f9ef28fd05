#include "kernels/tensor.h"

namespace kvtrim {

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
