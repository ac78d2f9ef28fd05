// Tests of the canonical window attention (window_attention.h): the streaming tree sum, a
// literal transcription of the documented definition, and accuracy against the fp64 oracle.
#include "kernels/cpu/window_attention.h"
#include "tests/testing/attention_test_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(WindowAttentionTest, TreeAccumulatorEqualsCmTreeSum) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t m = 0; m <= 1100; m += (m < 70 ? 1 : 37)) {
    std::vector<float> x(static_cast<size_t>(m));
    for (auto& v : x) v = normal(rng) * std::exp(3.0f * normal(rng));  // wide magnitudes
    TreeAccumulator<12> acc;
    for (float v : x) acc.Push(v);
    std::vector<float> copy = x;
    const float want = CmTreeSum(copy.data(), m);
    EXPECT_TRUE(SameBits(acc.Sum(), want)) << "m=" << m << " got " << acc.Sum() << " want " << want;
  }
}

TEST(WindowAttentionTest, TreeSumRowsIsColumnwiseCmTreeSum) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t m : {1, 2, 3, 5, 8, 13, 64, 65}) {
    const int64_t width = 7;
    std::vector<float> x(static_cast<size_t>(m * width));
    for (auto& v : x) v = normal(rng);
    std::vector<float> rows = x;
    TreeSumRows(rows.data(), m, width);
    for (int64_t i = 0; i < width; ++i) {
      std::vector<float> col(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r) col[r] = x[r * width + i];
      EXPECT_TRUE(SameBits(rows[i], CmTreeSum(col.data(), m))) << "m=" << m << " col " << i;
    }
  }
}

// The definition of window_attention.h transcribed step by step, with no scratch reuse.
struct SpecRow {
  int64_t visible = 0;
  std::vector<float> probs;   // [n]
  std::vector<float> output;  // [d]
};

SpecRow SpecAttentionRow(const CpuLayer& layer, int64_t q_head, int64_t t) {
  const int64_t n = layer.shape.num_tokens, d = layer.shape.head_dim;
  const int64_t h = q_head / layer.shape.group_size();
  SpecRow row;
  row.visible = std::clamp<int64_t>(n - layer.shape.window_rows + t + 1, 0, n);
  row.probs.assign(static_cast<size_t>(n), 0.0f);
  row.output.assign(static_cast<size_t>(d), 0.0f);
  const int64_t V = row.visible;
  if (V == 0) return row;
  std::vector<float> l(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) {
    l[j] = CmMul(CmDot(layer.queries.row(q_head, t), layer.keys.row(h, j), static_cast<int>(d)),
                 layer.softmax_scale);
  }
  std::vector<float> seg_m, seg_z;
  std::vector<std::vector<float>> seg_o;
  for (int64_t lo = 0; lo < V; lo += kAttnSegment) {
    const int64_t hi = std::min(lo + kAttnSegment, V);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = lo; j < hi; ++j) m = std::max(m, l[j]);
    std::vector<float> zc;
    std::vector<std::vector<float>> oc;
    for (int64_t c = lo; c < hi; c += kAttnChunk) {
      float z = 0.0f;
      std::vector<float> o(static_cast<size_t>(d), 0.0f);
      for (int64_t j = c; j < std::min(c + kAttnChunk, hi); ++j) {
        const float e = CmExp(CmAdd(l[j], -m));
        z = CmAdd(z, e);
        for (int64_t i = 0; i < d; ++i) o[i] = CmAdd(o[i], CmMul(e, layer.values.row(h, j)[i]));
      }
      zc.push_back(z);
      oc.push_back(o);
    }
    seg_m.push_back(m);
    seg_z.push_back(CmTreeSum(zc.data(), static_cast<int64_t>(zc.size())));
    std::vector<float> o(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) {
      std::vector<float> col;
      for (const auto& v : oc) col.push_back(v[i]);
      o[i] = CmTreeSum(col.data(), static_cast<int64_t>(col.size()));
    }
    seg_o.push_back(o);
  }
  const float M = *std::max_element(seg_m.begin(), seg_m.end());
  const int64_t segs = static_cast<int64_t>(seg_m.size());
  std::vector<float> terms(static_cast<size_t>(segs));
  for (int64_t s = 0; s < segs; ++s) terms[s] = CmMul(seg_z[s], CmExp(CmAdd(seg_m[s], -M)));
  const float Z = CmTreeSum(terms.data(), segs);
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t s = 0; s < segs; ++s) terms[s] = CmMul(seg_o[s][i], CmExp(CmAdd(seg_m[s], -M)));
    row.output[i] = CmDiv(CmTreeSum(terms.data(), segs), Z);
  }
  const float inv = CmDiv(1.0f, Z);
  for (int64_t j = 0; j < V; ++j) row.probs[j] = CmMul(CmExp(CmAdd(l[j], -M)), inv);
  return row;
}

TEST(WindowAttentionTest, ImplementsTheDocumentedDefinitionBitForBit) {
  struct Case { int64_t n, d, w; };
  // n crosses chunk (64) and segment (512) boundaries; w > n leaves rows with nothing visible.
  for (const Case c : {Case{1, 8, 1}, Case{7, 5, 3}, Case{64, 16, 2}, Case{65, 16, 4},
                       Case{512, 8, 2}, Case{513, 8, 3}, Case{1500, 13, 5}, Case{3, 8, 6}}) {
    const oracle::AttentionProblem pb = oracle::RandomProblem(c.n * 7 + c.d, 2, 2, c.n, c.d, c.w, 2.0);
    const CpuLayer layer = MakeLayer(pb);
    AttentionRowScratch scratch;  // reused across rows, as the scorers do
    std::vector<float> output(static_cast<size_t>(c.d));
    for (int64_t q = 0; q < 4; ++q) {
      for (int64_t t = 0; t < c.w; ++t) {
        const SpecRow want = SpecAttentionRow(layer, q, t);
        const AttentionRowStats got = ComputeAttentionRow(layer, q, t, output.data(), &scratch);
        ASSERT_EQ(got.visible, want.visible);
        for (int64_t j = 0; j < got.visible; ++j) {
          const float p = CanonicalProb(scratch.logits[j], got.neg_max, got.inv_sum);
          ASSERT_TRUE(SameBits(p, want.probs[j]))
              << "n=" << c.n << " q=" << q << " t=" << t << " j=" << j << ": " << p << " vs "
              << want.probs[j];
        }
        for (int64_t i = 0; i < c.d; ++i) {
          ASSERT_TRUE(SameBits(output[i], want.output[i]))
              << "n=" << c.n << " q=" << q << " t=" << t << " i=" << i;
        }
      }
    }
  }
}

TEST(WindowAttentionTest, CloseToTheFp64Oracle) {
  for (int64_t n : {1, 99, 600, 2000}) {
    const oracle::AttentionProblem pb = oracle::RandomProblem(900 + n, 1, 2, n, 32, 4, 2.0);
    const CpuLayer layer = MakeLayer(pb);
    AttentionRowScratch scratch;
    std::vector<float> output(32);
    for (int64_t q = 0; q < 2; ++q) {
      const std::vector<double> p = oracle::ProbMatrix(pb, q);
      const std::vector<double> a = oracle::OutputMatrix(pb, q);
      for (int64_t t = 0; t < 4; ++t) {
        const AttentionRowStats row = ComputeAttentionRow(layer, q, t, output.data(), &scratch);
        double max_rel = 0;
        for (int64_t j = 0; j < row.visible; ++j) {
          const double got = CanonicalProb(scratch.logits[j], row.neg_max, row.inv_sum);
          max_rel = std::max(max_rel, std::abs(got - p[t * n + j]) / std::max(p[t * n + j], 1e-30));
        }
        EXPECT_LT(max_rel, 2e-5) << "n=" << n << " q=" << q << " t=" << t;
        double norm = 0, err = 0;
        for (int64_t i = 0; i < 32; ++i) {
          norm += a[t * 32 + i] * a[t * 32 + i];
          err += (output[i] - a[t * 32 + i]) * (output[i] - a[t * 32 + i]);
        }
        if (row.visible == 0) {
          EXPECT_EQ(err, 0.0) << "a row that sees nothing has a = 0";
        } else {
          EXPECT_LT(std::sqrt(err / norm), 1e-5) << "n=" << n << " q=" << q << " t=" << t;
        }
      }
    }
  }
}

TEST(WindowAttentionTest, DropKVTermGuardsAndClamps) {
  // p = 1 with eps = 0: ratio = inf, but a non-positive distance contributes exactly 0.
  EXPECT_EQ(DropKVTerm(1.0f, 0.0f, 1.0f, 1.0f, 1.0f), 0.0f);
  EXPECT_TRUE(std::isinf(DropKVTerm(1.0f, 0.0f, 1.0f, 1.0f, 0.0f)));
  // Cancellation below zero is clamped to 0.
  EXPECT_EQ(DropKVTerm(0.5f, 1e-6f, 1.0f, 1.0f, 1.5f), 0.0f);
  // (0.5 / 0.5)^2 * (1 + 2 - 2*0.5) = 2.
  EXPECT_FLOAT_EQ(DropKVTerm(0.5f, 0.0f, 1.0f, 2.0f, 0.5f), 2.0f);
}

}  // namespace
}  // namespace kvtrim
