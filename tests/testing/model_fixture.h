// Deterministic random models for tests (header-only): a registration (ModelInput) with
// W_O for every layer, optional pre-RoPE query statistics and optional LU-KV profiles.
// Used by the service's registration tests and by the model-using policies' tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/model.h"

namespace kvtrim::testing {

/// Deterministic values in [-1, 1) from a 64-bit LCG seeded by `seed`.
inline std::vector<float> TestModelValues(int64_t count, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(count));
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
  for (float& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(static_cast<double>(state >> 40) / 16777216.0) * 2.0f - 1.0f;
  }
  return out;
}

/// An f32 RawTensor of `shape` holding `values`.
inline RawTensor TestRawTensor(const std::vector<int64_t>& shape,
                               const std::vector<float>& values) {
  RawTensor t;
  t.dtype = DType::kF32;
  t.shape = shape;
  t.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return t;
}

/// A valid registration named "test-model" with L layers, H_q query heads, H_kv KV heads,
/// head dim d (even) and hidden size D, rope_theta 10000 and no RoPE scaling:
///   layers.{l}.w_o         [D, H_q * d]  values in [-1, 1) / sqrt(D)
///   layers.{l}.query_mean  [H_q, d]      values in [-1, 1)       (with_query_stats only)
///   layers.{l}.query_cov   [H_q, d, d]   A A^T / d + 0.1 I, symmetric positive definite
/// The same arguments give the same bytes (and so the same digest).
inline ModelInput MakeTestModelInput(int L, int Hq, int Hkv, int d, int D, uint64_t seed,
                                     bool with_query_stats) {
  ModelInput input;
  input.layout.name = "test-model";
  input.layout.num_layers = L;
  input.layout.num_query_heads = Hq;
  input.layout.num_kv_heads = Hkv;
  input.layout.head_dim = d;
  input.layout.hidden_size = D;
  input.rope_theta = 10000.0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int l = 0; l < L; ++l) {
    const uint64_t base = seed * 1000003ULL + static_cast<uint64_t>(l) * 7919ULL;
    std::vector<float> w = TestModelValues(int64_t{D} * Hq * d, base + 1);
    for (float& v : w) v *= scale;
    input.tensors[absl::StrCat("layers.", l, ".w_o")] =
        TestRawTensor({D, int64_t{Hq} * d}, w);
    if (!with_query_stats) continue;
    input.tensors[absl::StrCat("layers.", l, ".query_mean")] =
        TestRawTensor({Hq, d}, TestModelValues(int64_t{Hq} * d, base + 2));
    std::vector<float> a = TestModelValues(int64_t{Hq} * d * d, base + 3);
    std::vector<float> cov(a.size());
    for (int h = 0; h < Hq; ++h) {
      const float* ah = a.data() + static_cast<size_t>(h) * d * d;
      float* ch = cov.data() + static_cast<size_t>(h) * d * d;
      for (int i = 0; i < d; ++i) {
        for (int j = 0; j < d; ++j) {
          double acc = 0;
          for (int k = 0; k < d; ++k) acc += double{ah[i * d + k]} * ah[j * d + k];
          ch[i * d + j] = static_cast<float>(acc / d + (i == j ? 0.1 : 0.0));
        }
      }
    }
    input.tensors[absl::StrCat("layers.", l, ".query_cov")] = TestRawTensor({Hq, d, d}, cov);
  }
  return input;
}

/// Adds profile `name` ([99, L, H_kv], registered as "profile.<name>") built for `metric`
/// with `sink` / `window` protected tokens: row k (global evicted ratio (k+1)/100) holds
/// local prune ratios min(1, (k+1)/100 * f) with a per-(layer, head) factor f in
/// [0.5, 1.5), so every head's curve is non-decreasing in k.
inline void AddTestProfile(ModelInput* input, const std::string& name, const std::string& metric,
                           int64_t sink, int64_t window, uint64_t seed) {
  const int64_t L = input->layout.num_layers, Hkv = input->layout.num_kv_heads;
  const std::vector<float> factors = TestModelValues(L * Hkv, seed * 31 + 17);
  std::vector<float> ratios(static_cast<size_t>(kLukvProfileRows * L * Hkv));
  for (int64_t k = 0; k < kLukvProfileRows; ++k) {
    for (int64_t i = 0; i < L * Hkv; ++i) {
      const float f = 1.0f + 0.5f * factors[i];
      ratios[k * L * Hkv + i] = std::min(1.0f, static_cast<float>(k + 1) / 100.0f * f);
    }
  }
  ProfileInput profile;
  profile.ratios = TestRawTensor({kLukvProfileRows, L, Hkv}, ratios);
  profile.metric = metric;
  profile.sink = sink;
  profile.window = window;
  input->profiles[name] = std::move(profile);
}

}  // namespace kvtrim::testing
