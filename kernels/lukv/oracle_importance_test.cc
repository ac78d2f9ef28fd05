// The oracle importance (lukv.md §3, §8) against a direct brute force: explicit W_O
// projections (no Gram matrix), explicit causal softmax, each GQA aggregation, k_max.
#include "kernels/lukv/oracle_importance.h"

#include <cmath>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/thread_pool.h"

namespace kvtrim::lukv {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// Brute force of §8 straight from the formula. Returns I [H_kv, T].
std::vector<double> BruteForce(const std::vector<float>& k, const std::vector<float>& v,
                               const std::vector<float>& q, const std::vector<float>& w,
                               const CalibrationDims& dims, int64_t D, int64_t k_max,
                               GqaAggregation agg) {
  const int64_t hkv = dims.num_kv_heads, hq = dims.num_query_heads, G = hq / hkv;
  const int64_t N = dims.num_tokens, d = dims.head_dim, T = dims.context_length;
  std::vector<double> out(static_cast<size_t>(hkv * T), 0.0);
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t p = dims.decode_start; p < std::min(N, dims.decode_start + k_max); ++p) {
      for (int64_t j = 0; j < T; ++j) {
        double acc = 0;
        for (int64_t g = h * G; g < (h + 1) * G; ++g) {
          std::vector<double> logits(static_cast<size_t>(p + 1));
          for (int64_t m = 0; m <= p; ++m) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += double{q[(g * N + p) * d + c]} * k[(h * N + m) * d + c];
            logits[m] = dot / std::sqrt(static_cast<double>(d));
          }
          double z = 0;
          for (double x : logits) z += std::exp(x);
          const double a = std::exp(logits[j]) / z;
          double norm2 = 0;  // ‖v W_O^g‖² with W_O^g = w[:, g*d:(g+1)*d]ᵀ
          for (int64_t e = 0; e < D; ++e) {
            double y = 0;
            for (int64_t c = 0; c < d; ++c) y += double{v[(h * N + j) * d + c]} * w[e * hq * d + g * d + c];
            norm2 += y * y;
          }
          const double contrib = a * std::sqrt(norm2);
          acc = agg == GqaAggregation::kMax ? std::max(acc, contrib) : acc + contrib;
        }
        if (agg == GqaAggregation::kMean) acc /= static_cast<double>(G);
        out[h * T + j] = std::max(out[h * T + j], acc);
      }
    }
  }
  return out;
}

TEST(LukvOracleTest, MatchesBruteForce) {
  std::mt19937 rng(31);
  CalibrationDims dims;
  dims.num_layers = 1;
  dims.num_kv_heads = 2;
  dims.num_query_heads = 6;
  dims.head_dim = 4;
  dims.num_tokens = 17;
  dims.context_length = 9;
  dims.decode_start = 12;
  const int64_t D = 5, N = dims.num_tokens, d = dims.head_dim;
  std::vector<float> k = RandomVector(2 * N * d, rng), v = RandomVector(2 * N * d, rng);
  std::vector<float> q = RandomVector(6 * N * d, rng), w = RandomVector(D * 6 * d, rng);
  const F32Tensor K = F32Tensor::Owning(k, {2, N, d}), V = F32Tensor::Owning(v, {2, N, d});
  const F32Tensor Q = F32Tensor::Owning(q, {6, N, d}), W = F32Tensor::Owning(w, {1, D, 6 * d});
  ThreadPool pool(2);
  for (GqaAggregation agg : {GqaAggregation::kMean, GqaAggregation::kSum, GqaAggregation::kMax}) {
    for (int64_t k_max : {1, 3, 128}) {
      OracleOptions options;
      options.gqa = agg;
      options.k_max = k_max;
      const std::vector<double> got = OracleImportance(K, V, Q, W, dims, 0, options, &pool);
      const std::vector<double> want = BruteForce(k, v, q, w, dims, D, k_max, agg);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + want[i]))
            << GqaAggregationName(agg) << " k_max " << k_max << " i " << i;
      }
      // Serial and threaded agree exactly.
      EXPECT_EQ(OracleImportance(K, V, Q, W, dims, 0, options, nullptr), got);
    }
  }
}

TEST(LukvOracleTest, NormaliseLayer) {
  std::vector<double> x{1, 3, 0, 4};
  NormaliseLayer(&x);
  EXPECT_EQ(x, (std::vector<double>{0.125, 0.375, 0, 0.5}));
  std::vector<double> zero{0, 0};
  NormaliseLayer(&zero);
  EXPECT_EQ(zero, (std::vector<double>{0, 0}));
}

TEST(LukvOracleTest, ParseAggregation) {
  EXPECT_EQ(*ParseGqaAggregation("mean"), GqaAggregation::kMean);
  EXPECT_EQ(*ParseGqaAggregation("sum"), GqaAggregation::kSum);
  EXPECT_EQ(*ParseGqaAggregation("max"), GqaAggregation::kMax);
  EXPECT_FALSE(ParseGqaAggregation("median").ok());
  EXPECT_STREQ(GqaAggregationName(GqaAggregation::kMax), "max");
}

}  // namespace
}  // namespace kvtrim::lukv
