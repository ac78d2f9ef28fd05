// Shared by the GPU tests of the model-aware policies (model_parity_test.cc): deterministic
// layer tensors in any dtype, random registered models cached by layout, and the CPU / GPU
// backends every case reuses.
#pragma once

#include <cstdint>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "base/dtype.h"
#include "kernels/layer.h"
#include "kernels/model.h"
#include "tests/testing/random_model_test_util.h"
#include "tests/gpu/shared_backends.h"

namespace kvtrim::gpu::testing {

/// Host tensors of one layer encoded in a dtype.
struct ModelLayerData {
  std::vector<uint8_t> keys, values, queries;
};

/// SplitMix64 finaliser.
inline uint64_t MixBits(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Approximately N(0, 1) from a counter hash: four 16-bit uniforms, centred and scaled.
inline float HashNormal(uint64_t stream, uint64_t i) {
  const uint64_t h = MixBits(stream * 0xD1B54A32D192ED03ull ^ i);
  float sum = 0.0f;
  for (int k = 0; k < 4; ++k) sum += static_cast<float>((h >> (16 * k)) & 0xFFFF) / 65536.0f;
  return (sum - 2.0f) * 1.7320508f;
}

/// Encodes fp32 values in `dtype` (f16 / bf16 round to nearest even).
inline std::vector<uint8_t> EncodeAs(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16(values[i]) : FloatToF16(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

/// K, V ~ N(0, 1), Q ~ N(0, 1.5^2) for [H_kv, n, d] / [H_kv * G, w, d]; every 17th token from
/// token 8 on repeats the key and value of the token 5 before it (ties).
inline ModelLayerData MakeModelLayerData(DType dtype, int64_t heads, int64_t n, int64_t d,
                                         int64_t group, int64_t w, uint64_t seed) {
  std::vector<float> k(static_cast<size_t>(heads * n * d));
  std::vector<float> v(k.size());
  std::vector<float> q(static_cast<size_t>(heads * group * w * d));
  for (size_t i = 0; i < k.size(); ++i) k[i] = HashNormal(3 * seed, i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = HashNormal(3 * seed + 1, i);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 1.5f * HashNormal(3 * seed + 2, i);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 8; j < n; j += 17) {
      const size_t dst = static_cast<size_t>((h * n + j) * d);
      const size_t src = static_cast<size_t>((h * n + j - 5) * d);
      std::memcpy(k.data() + dst, k.data() + src, static_cast<size_t>(d) * sizeof(float));
      std::memcpy(v.data() + dst, v.data() + src, static_cast<size_t>(d) * sizeof(float));
    }
  }
  return {EncodeAs(k, dtype), EncodeAs(v, dtype), EncodeAs(q, dtype)};
}

/// What a test model looks like.
struct TestModelKey {
  int32_t kv_heads = 3, group = 1, head_dim = 64, hidden = 64, layers = 2;
  int64_t profile_window = -1;  // >= 0: a profile.<profile_metric> with this window
  std::string profile_metric = "snapkv";
  int64_t profile_sink = 0;
  bool operator<(const TestModelKey& o) const {
    return std::tie(kv_heads, group, head_dim, hidden, layers, profile_window, profile_metric,
                    profile_sink) < std::tie(o.kv_heads, o.group, o.head_dim, o.hidden,
                                             o.layers, o.profile_window, o.profile_metric,
                                             o.profile_sink);
  }
};

/// A random registered model with query statistics (RandomModel of
/// tests/testing/random_model_test_util.h), built once per key and shared (thread-safe).
inline std::shared_ptr<const RegisteredModel> TestModel(const TestModelKey& key) {
  static auto* cache = new OnceCache<TestModelKey, std::shared_ptr<const RegisteredModel>>();
  return *cache->Get(key, [&] {
    RandomModelOptions o;
    o.layers = key.layers;
    o.kv_heads = key.kv_heads;
    o.query_heads = key.kv_heads * key.group;
    o.head_dim = key.head_dim;
    o.hidden = key.hidden;
    o.seed = static_cast<uint64_t>(key.head_dim * 131 + key.group * 17 + key.hidden);
    o.query_stats = true;
    if (key.profile_window >= 0) {
      o.profile_metric = key.profile_metric;
      o.profile_sink = key.profile_sink;
      o.profile_window = key.profile_window;
    }
    return RandomModel(o);
  });
}

}  // namespace kvtrim::gpu::testing
