#include "kernels/cpu/cpu_layer.h"

namespace kvtrim {

CpuLayer CpuLayer::From(const ValidatedLayer& layer) {
  CpuLayer out;
  out.layer_id = layer.layer_id;
  out.num_layers = layer.num_layers;
  out.shape = layer.shape;
  out.keys = F32Tensor::FromView(layer.keys);
  out.values = F32Tensor::FromView(layer.values);
  out.queries = F32Tensor::FromView(layer.queries);
  out.softmax_scale = layer.softmax_scale;
  out.seed = layer.seed;
  out.input_dtype = layer.keys.dtype;
  return out;
}

}  // namespace kvtrim
