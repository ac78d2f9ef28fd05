// Fuzz target: the RoPE scaling JSON of a model header (kernels/model.h ParseRopeScaling,
// what RegisterModel and kvtrimd's model files carry as rope_scaling_json). The input's
// first 8 bytes are rope_theta (a little-endian double) and the 9th the head dimension's
// half; the rest is the JSON text. An accepted configuration's inverse frequencies are then
// computed (they feed the model-aware scorers' RoPE).
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  double theta = 0;
  std::memcpy(&theta, data, sizeof theta);
  const int64_t head_dim = 2 * (1 + data[8] % 64);  // even, as BuildModel requires
  const std::string json(reinterpret_cast<const char*>(data) + 9, size - 9);
  absl::StatusOr<kvtrim::RopeConfig> rope = kvtrim::ParseRopeScaling(theta, json, "header");
  if (!rope.ok()) return 0;
  const std::vector<double> inv = rope->InverseFrequencies(head_dim);
  if (static_cast<int64_t>(inv.size()) != head_dim / 2) __builtin_trap();
  return 0;
}
