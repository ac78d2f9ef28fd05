// Test helper: a random fp32 layer request (used by the engine and CPU backend tests).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/layer.h"

namespace kvtrim {

/// Random normal fp32 layer that owns its tensors: keys/values [hkv, n, d] and queries
/// [hq, w, d], with `request` viewing them. After copying, re-point `request` at the copy.
struct RandomLayer {
  std::vector<float> k, v, q;
  LayerRequest request;
  RandomLayer(int64_t hkv, int64_t n, int64_t d, int64_t hq, int64_t w, uint32_t seed = 3) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    k.resize(hkv * n * d);
    v.resize(hkv * n * d);
    q.resize(hq * w * d);
    for (auto* t : {&k, &v, &q}) {
      for (auto& x : *t) x = normal(rng);
    }
    request.keys = {k.data(), DType::kF32, {hkv, n, d}};
    request.values = {v.data(), DType::kF32, {hkv, n, d}};
    request.queries = {q.data(), DType::kF32, {hq, w, d}};
  }
};

}  // namespace kvtrim
