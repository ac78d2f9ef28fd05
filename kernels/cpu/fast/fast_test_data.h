// Shared by the fast CPU numerics tests (fast_tolerance_test.cc, fast_model_scores_test.cc):
// random layer tensors in any dtype and the options of their random test models.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"

namespace kvtrim {

/// The registry with the builtin policies, built once and shared.
inline const PolicyRegistry& FastTestRegistry() {
  static const PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry();
    RegisterBuiltinPolicies(r);
    return r;
  }();
  return *registry;
}

/// `count` values scale * N(0, 1) from `rng`, encoded in `dtype` (f16 / bf16 round to nearest
/// even), as raw bytes.
inline std::vector<uint8_t> RandomEncoded(DType dtype, int64_t count, float scale,
                                          std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<uint8_t> out(static_cast<size_t>(count) * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const float x = scale * normal(rng);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

/// A random model's options for H_kv heads, G query heads each, head dimension d, hidden
/// size D and `layers` layers, with query statistics (seeded by the shape).
inline RandomModelOptions FastTestModelOptions(int64_t kv_heads, int64_t group, int64_t d,
                                               int64_t hidden, int32_t layers) {
  RandomModelOptions o;
  o.layers = layers;
  o.kv_heads = static_cast<int32_t>(kv_heads);
  o.query_heads = static_cast<int32_t>(kv_heads * group);
  o.head_dim = static_cast<int32_t>(d);
  o.hidden = static_cast<int32_t>(hidden);
  o.seed = static_cast<uint64_t>(d * 131 + group * 17 + hidden);
  o.query_stats = true;
  return o;
}

}  // namespace kvtrim
