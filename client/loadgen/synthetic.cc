#include "client/loadgen/synthetic.h"

#include <cmath>
#include <cstring>

namespace kvtrim::loadgen {
namespace {

/// The binary32 bits of `value`.
uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

/// splitmix64: the next value of the stream whose state is `state`.
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A uniform double in (0, 1] from the top 53 bits of a stream value.
double Uniform(uint64_t& state) {
  return static_cast<double>((SplitMix64(state) >> 11) + 1) * (1.0 / 9007199254740992.0);
}

/// A tensor of shape `shape` with N(0, 1) values from `seed`, as `dtype` bytes.
std::string Tensor(v1::DType dtype, uint64_t seed, const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return EncodeAs(dtype, NormalSamples(seed, static_cast<size_t>(count)));
}

/// Fills `tensor` with `dtype` and `shape` (no data).
void SetHeader(v1::Tensor* tensor, v1::DType dtype, const std::vector<int64_t>& shape) {
  tensor->set_dtype(dtype);
  for (int64_t extent : shape) tensor->add_shape(extent);
}

}  // namespace

std::vector<float> NormalSamples(uint64_t seed, size_t count) {
  std::vector<float> out(count);
  uint64_t state = seed;
  constexpr double kTwoPi = 6.283185307179586;
  for (size_t i = 0; i < count; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(Uniform(state)));
    const double angle = kTwoPi * Uniform(state);
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < count) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
  return out;
}

std::string EncodeAs(v1::DType dtype, const std::vector<float>& values) {
  std::string bytes;
  if (dtype == v1::DTYPE_F32) {
    bytes.resize(values.size() * 4);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint32_t bits = Bits(values[i]);
      for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>(bits >> (8 * b));
    }
    return bytes;
  }
  bytes.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t half = dtype == v1::DTYPE_BF16 ? FloatToBf16(values[i]) : FloatToF16(values[i]);
    bytes[2 * i] = static_cast<char>(half & 0xff);
    bytes[2 * i + 1] = static_cast<char>(half >> 8);
  }
  return bytes;
}

HostLayer MakeHostLayer(const LoadgenConfig& config, bool values, bool queries) {
  HostLayer layer;
  layer.dtype = config.dtype;
  layer.kv_shape = {config.kv_heads, config.tokens, config.head_dim};
  layer.query_shape = {config.q_heads, config.window, config.head_dim};
  // One independent stream per tensor, all derived from the seed.
  layer.keys = Tensor(config.dtype, config.seed * 3 + 1, layer.kv_shape);
  if (values) layer.values = Tensor(config.dtype, config.seed * 3 + 2, layer.kv_shape);
  if (queries) layer.queries = Tensor(config.dtype, config.seed * 3 + 3, layer.query_shape);
  return layer;
}

v1::LayerInput LayerTemplate(const HostLayer& layer, int32_t layer_id) {
  v1::LayerInput input;
  input.set_layer_id(layer_id);
  SetHeader(input.mutable_keys(), layer.dtype, layer.kv_shape);
  if (!layer.values.empty()) SetHeader(input.mutable_values(), layer.dtype, layer.kv_shape);
  if (!layer.queries.empty()) {
    SetHeader(input.mutable_queries(), layer.dtype, layer.query_shape);
  }
  return input;
}

}  // namespace kvtrim::loadgen
