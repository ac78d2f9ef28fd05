// Test helper: a random registered model (BuildModel over random W_O, optional query
// statistics and LU-KV profile) for the kernel tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/model.h"

namespace kvtrim {

/// f32 RawTensor from values.
inline RawTensor F32Raw(const std::vector<float>& values, std::vector<int64_t> shape) {
  RawTensor t;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(float));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

/// Options of RandomModelInput.
struct RandomModelOptions {
  int32_t layers = 2, query_heads = 4, kv_heads = 2, head_dim = 8, hidden = 32;
  uint64_t seed = 1;
  bool query_stats = false;
  std::string profile_metric;  // non-empty: adds profile.<metric> with random ratios
  int64_t profile_sink = 0, profile_window = 32;
  double w_o_scale = 0.3;
};

/// Options of a model of `layers` layers, H_q query heads, H_kv KV heads, head dim d, hidden
/// size D and `seed`; the rest at their defaults (set them on the result).
inline RandomModelOptions RandomModelLayout(int32_t layers, int32_t query_heads,
                                            int32_t kv_heads, int32_t head_dim, int32_t hidden,
                                            uint64_t seed) {
  RandomModelOptions options;
  options.layers = layers;
  options.query_heads = query_heads;
  options.kv_heads = kv_heads;
  options.head_dim = head_dim;
  options.hidden = hidden;
  options.seed = seed;
  return options;
}

/// A random ModelInput: W_O N(0, w_o_scale^2); query mean N(0,1), covariance A A^T / d;
/// profile ratios sorted increasing in the row index (like real profiles).
inline ModelInput RandomModelInput(const RandomModelOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  ModelInput in;
  in.layout = {"random", o.layers, o.query_heads, o.kv_heads, o.head_dim, o.hidden};
  const int64_t d = o.head_dim, hq = o.query_heads;
  for (int32_t l = 0; l < o.layers; ++l) {
    std::vector<float> w(static_cast<size_t>(o.hidden * hq * d));
    for (auto& x : w) x = normal(rng) * static_cast<float>(o.w_o_scale);
    in.tensors[absl::StrCat("layers.", l, ".w_o")] = F32Raw(w, {o.hidden, hq * d});
    if (o.query_stats) {
      std::vector<float> mean(static_cast<size_t>(hq * d)), cov(static_cast<size_t>(hq * d * d));
      for (auto& x : mean) x = normal(rng);
      for (int64_t q = 0; q < hq; ++q) {
        std::vector<float> a(static_cast<size_t>(d * d));
        for (auto& x : a) x = normal(rng);
        for (int64_t i = 0; i < d; ++i) {
          for (int64_t k = 0; k < d; ++k) {
            double acc = 0;
            for (int64_t m = 0; m < d; ++m) acc += a[i * d + m] * a[k * d + m];
            cov[(q * d + i) * d + k] = static_cast<float>(acc / static_cast<double>(d));
          }
        }
      }
      in.tensors[absl::StrCat("layers.", l, ".query_mean")] = F32Raw(mean, {hq, d});
      in.tensors[absl::StrCat("layers.", l, ".query_cov")] = F32Raw(cov, {hq, d, d});
    }
  }
  if (!o.profile_metric.empty()) {
    const int64_t per_row = int64_t{o.layers} * o.kv_heads;
    std::vector<float> ratios(static_cast<size_t>(kLukvProfileRows * per_row));
    std::vector<float> offset(static_cast<size_t>(per_row));
    for (auto& x : offset) x = (uniform(rng) - 0.5f) * 0.2f;
    for (int64_t r = 0; r < kLukvProfileRows; ++r) {
      for (int64_t i = 0; i < per_row; ++i) {
        const float rho = static_cast<float>(r + 1) / 100.0f;
        ratios[r * per_row + i] = std::min(0.99f, std::max(0.0f, rho + offset[i] * rho * (1 - rho)));
      }
    }
    ProfileInput p;
    p.ratios = F32Raw(ratios, {kLukvProfileRows, o.layers, o.kv_heads});
    p.metric = o.profile_metric;
    p.sink = o.profile_sink;
    p.window = o.profile_window;
    in.profiles[o.profile_metric] = std::move(p);
  }
  return in;
}

/// BuildModel(RandomModelInput(o)) with digest "sha256:test"; aborts on error.
inline std::shared_ptr<const RegisteredModel> RandomModel(const RandomModelOptions& o) {
  auto built = BuildModel(RandomModelInput(o));
  if (!built.ok()) std::abort();
  (*built)->digest = "sha256:test";
  return *built;
}

}  // namespace kvtrim
