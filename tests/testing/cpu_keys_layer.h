// Test helpers of the key-only CPU scorers: a CpuLayer that owns random keys, a table
// scorer by name, and one scorer run over a layer.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/cpu_scorer_table.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvtrim::testing {

/// A CpuLayer owning random N(0, scale^2) keys [H, n, d] fp32 (no values or queries), with
/// `layer_id` and the random scorer's `seed`.
inline CpuLayer RandomKeysLayer(int64_t heads, int64_t n, int64_t d, uint64_t rng_seed,
                                int32_t layer_id = 0, uint64_t seed = 0, float scale = 1.0f) {
  std::mt19937_64 rng(rng_seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> keys(static_cast<size_t>(heads * n * d));  // [H, n, d] fp32
  for (float& x : keys) x = normal(rng);
  CpuLayer layer;
  layer.layer_id = layer_id;
  layer.num_layers = layer_id + 1;
  layer.shape.num_kv_heads = heads;
  layer.shape.num_tokens = n;
  layer.shape.head_dim = d;
  layer.keys = F32Tensor::Owning(std::move(keys), {heads, n, d});
  layer.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  layer.seed = seed;
  return layer;
}

/// The CPU table scorer registered as `name`: its fast scorer when `fast` (its exact one
/// where it has none), else its exact one; fails the test (and returns a scorer that writes
/// nothing) when no file registers `name`.
inline CpuScoreFn TableScorer(const char* name, bool fast = false) {
  const CpuScorer* scorer = CpuScorerTable::Builtin().Find(name);
  EXPECT_NE(scorer, nullptr) << name << " is not in the CPU scorer table";
  if (scorer == nullptr) {
    return [](const CpuLayer&, const ResolvedParams&, ThreadPool&, float*) {
      return absl::NotFoundError("no such table scorer");
    };
  }
  return fast && scorer->fast != nullptr ? scorer->fast : scorer->exact;
}

/// Runs the CPU scorer `fn` (kernels/cpu/cpu_scorer_table.h's CpuScoreFn signature) on
/// `layer` with default parameters and a pool of `threads` threads; returns scores [H, n]
/// (NaN where it wrote nothing) and fails the test when it returns an error.
template <typename Fn>
std::vector<float> RunCpuScorer(Fn fn, const CpuLayer& layer, int threads) {
  ThreadPool pool(threads);
  std::vector<float> scores(
      static_cast<size_t>(layer.shape.num_kv_heads * layer.shape.num_tokens), NAN);
  const absl::Status st = fn(layer, ResolvedParams{}, pool, scores.data());
  EXPECT_TRUE(st.ok()) << st;
  return scores;
}

}  // namespace kvtrim::testing
