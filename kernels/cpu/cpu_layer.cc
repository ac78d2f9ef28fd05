#include "kernels/cpu/cpu_layer.h"

namespace kvtrim {

CpuLayer CpuLayer::From(const ValidatedLayer& layer, bool widen_keys_values) {
  CpuLayer out;
  out.layer_id = layer.layer_id;
  out.num_layers = layer.num_layers;
  out.shape = layer.shape;
  const auto widen = [&](const TensorView& view) {
    return widen_keys_values || view.dtype == DType::kF32 ? F32Tensor::FromView(view)
                                                          : F32Tensor();
  };
  out.keys = widen(layer.keys);
  out.values = widen(layer.values);
  out.keys_in = layer.keys;
  out.values_in = layer.values;
  out.queries = F32Tensor::FromView(layer.queries);
  out.softmax_scale = layer.softmax_scale;
  out.seed = layer.seed;
  out.input_dtype = layer.keys.dtype;
  out.unchecked_keys_field = layer.unchecked_keys_field;
  if (!out.unchecked_keys_field.empty()) {
    out.keys_nonfinite = std::make_shared<std::atomic<bool>>(false);
  }
  return out;
}

}  // namespace kvtrim
