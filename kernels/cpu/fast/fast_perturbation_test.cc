// The fast perturbation statistic (fast_perturbation.h) against the exact fp64 one
// (perturbation.h): |fast - exact| <= 1e-3 |exact| + 1e-4 (docs/numerics.md, the GPU's
// bound) over sizes, head dimensions, group sizes, per-head and shared lists (empty and
// full among them), every SIMD path, the slab and the recomputing path; the sampled
// statistic is exactly the statistic of a window of the last rows; 1, 2 and 7 threads give
// the same bits.
#include "kernels/cpu/fast/fast_perturbation.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/attention_test_layer.h"
#include "kernels/cpu/fast/dropkv_cost.h"
#include "kernels/cpu/fast/fast_cpu.h"
#include "kernels/cpu/perturbation.h"
#include "base/dtype.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

/// Kept lists of one case: per head (random sizes, the first empty and the second full
/// when there are enough heads) or one shared list.
struct KeptLists {
  std::vector<int64_t> offsets;
  std::vector<int32_t> kept;
};

KeptLists RandomLists(std::mt19937_64& rng, int64_t heads, int64_t n, bool shared) {
  KeptLists out{{0}, {}};
  const int64_t lists = shared ? 1 : heads;
  for (int64_t h = 0; h < lists; ++h) {
    std::vector<int32_t> all(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) all[j] = static_cast<int32_t>(j);
    std::shuffle(all.begin(), all.end(), rng);
    int64_t size = std::uniform_int_distribution<int64_t>(0, n)(rng);
    if (!shared && heads > 2 && h == 0) size = 0;
    if (!shared && heads > 2 && h == 1) size = n;
    all.resize(static_cast<size_t>(size));
    std::sort(all.begin(), all.end());
    out.kept.insert(out.kept.end(), all.begin(), all.end());
    out.offsets.push_back(static_cast<int64_t>(out.kept.size()));
  }
  return out;
}

std::vector<double> Exact(const CpuLayer& layer, const KeptLists& lists) {
  ThreadPool pool(2);
  std::vector<double> out(static_cast<size_t>(layer.shape.num_kv_heads));
  OutputPerturbation(layer, lists.offsets, lists.kept, pool, out.data());
  return out;
}

std::vector<double> Fast(const CpuLayer& layer, const KeptLists& lists, int64_t rows,
                         int threads = 2) {
  ThreadPool pool(threads);
  std::vector<double> out(static_cast<size_t>(layer.shape.num_kv_heads), -1.0);
  FastOutputPerturbation(layer, lists.offsets, lists.kept, rows, pool, out.data());
  return out;
}

/// The layer with only its last `rows` window rows (the sampled statistic's window).
CpuLayer LastRows(const oracle::AttentionProblem& pb, int64_t rows) {
  oracle::AttentionProblem cut = pb;
  cut.window_rows = rows;
  cut.queries.clear();
  for (int64_t q = 0; q < pb.num_query_heads; ++q) {
    for (int64_t t = pb.window_rows - rows; t < pb.window_rows; ++t) {
      const auto row = pb.queries.begin() + (q * pb.window_rows + t) * pb.head_dim;
      cut.queries.insert(cut.queries.end(), row, row + pb.head_dim);
    }
  }
  return MakeLayer(cut);
}

struct Case {
  int64_t heads, group, n, d, w;
};

/// Checks every case of `cases` on the current SIMD path and slab setting.
void CheckCases(const std::vector<Case>& cases) {
  std::mt19937_64 rng(31);
  uint64_t seed = 900;
  double worst = 0;
  for (const Case& c : cases) {
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.heads, c.group, c.n, c.d, c.w, 2.0);
    const CpuLayer layer = MakeLayer(pb);
    for (bool shared : {false, true}) {
      SCOPED_TRACE(testing::Message() << "H_kv=" << c.heads << " G=" << c.group << " n=" << c.n
                                      << " d=" << c.d << " w=" << c.w << " shared=" << shared);
      const KeptLists lists = RandomLists(rng, c.heads, c.n, shared);
      const std::vector<double> exact = Exact(layer, lists);
      const std::vector<double> fast = Fast(layer, lists, c.w);
      for (int64_t h = 0; h < c.heads; ++h) {
        EXPECT_NEAR(fast[h], exact[h], 1e-3 * std::fabs(exact[h]) + 1e-4) << "head " << h;
        worst = std::max(worst, std::fabs(fast[h] - exact[h]) / (std::fabs(exact[h]) + 1e-3));
      }
    }
  }
  std::printf("fast perturbation on %s: worst |fast - exact| / (|exact| + 1e-3) = %.3g\n",
              FastCpuTarget().c_str(), worst);
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1, 1, 1, 64, 1},    {3, 4, 7, 72, 7},    {3, 1, 99, 128, 32}, {2, 4, 1000, 64, 32},
      {3, 4, 1000, 128, 8}, {2, 8, 5000, 128, 16}, {2, 4, 5, 64, 8},  // w > n: empty rows
      {2, 3, 300, 40, 5}};
  return cases;
}

TEST(FastPerturbation, WithinTheBoundOfTheExactStatistic) { CheckCases(Cases()); }

TEST(FastPerturbation, ForcedSimdPathsAndRecomputedLogitsWithinTheBound) {
  SetCpuSimdLimitForTest(CpuSimdLimit::kAvx2);
  CheckCases(Cases());
  SetCpuSimdLimitForTest(CpuSimdLimit::kScalar);
  CheckCases(Cases());
  SetCpuSimdLimitForTest(CpuSimdLimit::kBest);
  SetCpuSlabBytesForTest(0);
  CheckCases(Cases());
  SetCpuSlabBytesForTest(int64_t{8} << 20);
}

TEST(FastPerturbation, SampledIsTheStatisticOfTheLastRows) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(7, 3, 4, 700, 64, 32, 2.0);
  std::mt19937_64 rng(5);
  const KeptLists lists = RandomLists(rng, 3, 700, false);
  const std::vector<double> sampled = Fast(MakeLayer(pb), lists, 8);
  const std::vector<double> window_of_eight = Fast(LastRows(pb, 8), lists, 8);
  const std::vector<double> exact_of_eight = Exact(LastRows(pb, 8), lists);
  for (int64_t h = 0; h < 3; ++h) {
    EXPECT_EQ(sampled[h], window_of_eight[h]) << "head " << h;
    EXPECT_NEAR(sampled[h], exact_of_eight[h], 1e-3 * exact_of_eight[h] + 1e-4);
  }
}

TEST(FastPerturbation, Bf16AndF16KeysAndValuesReadAsTheyArrived) {
  // The fast statistic widens tiles of 16-bit keys and values itself (no fp32 copy): the
  // same answer as the exact one on the widened tensors.
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    oracle::AttentionProblem pb = oracle::RandomProblem(9, 2, 4, 1500, 72, 16, 2.0);
    std::vector<uint16_t> keys(pb.keys.size()), values(pb.values.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      keys[i] = dtype == DType::kBF16 ? FloatToBf16(pb.keys[i]) : FloatToF16(pb.keys[i]);
      values[i] = dtype == DType::kBF16 ? FloatToBf16(pb.values[i]) : FloatToF16(pb.values[i]);
      pb.keys[i] = dtype == DType::kBF16 ? Bf16ToFloat(keys[i]) : F16ToFloat(keys[i]);
      pb.values[i] = dtype == DType::kBF16 ? Bf16ToFloat(values[i]) : F16ToFloat(values[i]);
    }
    const CpuLayer widened = MakeLayer(pb);
    CpuLayer arrived = widened;
    arrived.keys = F32Tensor();
    arrived.values = F32Tensor();
    arrived.keys_in = {keys.data(), dtype, {2, 1500, 72}};
    arrived.values_in = {values.data(), dtype, {2, 1500, 72}};
    std::mt19937_64 rng(10);
    const KeptLists lists = RandomLists(rng, 2, 1500, false);
    const std::vector<double> exact = Exact(widened, lists);
    const std::vector<double> fast = Fast(arrived, lists, 16);
    EXPECT_EQ(fast, Fast(widened, lists, 16));  // the same fp32 values either way
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_NEAR(fast[h], exact[h], 1e-3 * std::fabs(exact[h]) + 1e-4) << "head " << h;
    }
  }
}

TEST(FastPerturbation, DropKVsRowOutputsGiveTheSameStatistic) {
  // The sampled statistic over DropKV's own window rows takes the scorer's outputs instead
  // of a second full run: the same blocks of rows, so the same bits.
  for (int64_t group : {1, 4, 12}) {
    const oracle::AttentionProblem pb = oracle::RandomProblem(11, 3, group, 900, 64, 32, 2.0);
    const CpuLayer layer = MakeLayer(pb);
    ThreadPool pool(2);
    std::vector<float> cost(static_cast<size_t>(3 * 900));
    std::vector<float> rows(static_cast<size_t>(3 * group * 8 * 64));
    FastDropKVCost(layer, 8, 1e-6f, false, pool, cost.data(), rows.data());
    std::mt19937_64 rng(12);
    for (bool shared : {false, true}) {
      const KeptLists lists = RandomLists(rng, 3, 900, shared);
      std::vector<double> reused(3);
      FastOutputPerturbation(layer, lists.offsets, lists.kept, 8, pool, reused.data(),
                             rows.data());
      EXPECT_EQ(reused, Fast(layer, lists, 8)) << "G=" << group << " shared=" << shared;
    }
  }
}

TEST(FastPerturbation, SameBitsOnAnyThreadCount) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(8, 3, 12, 3000, 128, 32, 2.0);
  std::mt19937_64 rng(6);
  for (bool shared : {false, true}) {
    const KeptLists lists = RandomLists(rng, 3, 3000, shared);
    const CpuLayer layer = MakeLayer(pb);
    const std::vector<double> one = Fast(layer, lists, 32, 1);
    EXPECT_EQ(Fast(layer, lists, 32, 2), one);
    EXPECT_EQ(Fast(layer, lists, 32, 7), one);
  }
}

}  // namespace
}  // namespace kvtrim
