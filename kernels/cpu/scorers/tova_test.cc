// TOVA scorer vs the dense fp64 oracle (baselines §6).
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/scorers.h"
#include "tests/testing/attention_test_layer.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {
namespace {

std::vector<float> Score(const oracle::AttentionProblem& pb, int threads = 2) {
  ThreadPool pool(threads);
  std::vector<float> scores(static_cast<size_t>(pb.num_kv_heads * pb.num_tokens), -1.0f);
  absl::Status st = ScoreTova(MakeLayer(pb), ResolvedParams(), pool, scores.data());
  EXPECT_TRUE(st.ok()) << st;
  return scores;
}

struct Case {
  int64_t h_kv, group, n, d, w;
};

TEST(TovaTest, MatchesOracleAndIsSharedByEveryHead) {
  const std::vector<Case> cases = {{1, 1, 1, 8, 1},  {2, 4, 7, 16, 3},  {4, 7, 99, 8, 5},
                                   {3, 1, 99, 16, 1}, {8, 4, 300, 64, 8}};
  uint64_t seed = 300;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "H_kv=" << c.h_kv << " G=" << c.group << " n=" << c.n
                                    << " w=" << c.w);
    const oracle::AttentionProblem pb =
        oracle::RandomProblem(++seed, c.h_kv, c.group, c.n, c.d, c.w, 2.0);
    const std::vector<float> got = Score(pb);
    const std::vector<double> want = oracle::TovaScores(pb);
    EXPECT_LT(oracle::MaxRelativeError(got.data(), want.data(), c.h_kv * c.n), 1e-4);
    EXPECT_EQ(oracle::CompareTopK(got.data(), want.data(), c.n, std::max<int64_t>(1, c.n / 5),
                                  1e-5),
              "");
    for (int64_t h = 1; h < c.h_kv; ++h) {
      const std::vector<float> row0(got.begin(), got.begin() + c.n);
      const std::vector<float> row(got.begin() + h * c.n, got.begin() + (h + 1) * c.n);
      EXPECT_EQ(row, row0) << "head " << h << " differs from head 0";
    }
  }
}

TEST(TovaTest, LastRowOfEveryQueryHeadCounts) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(31, 3, 2, 40, 8, 4, 2.0);
  const std::vector<float> base = Score(pb);
  // Earlier rows are ignored.
  oracle::AttentionProblem earlier = pb;
  for (int64_t q = 0; q < 6; ++q) {
    for (int64_t i = 0; i < 3 * 8; ++i) earlier.queries[q * 4 * 8 + i] *= -2.0f;
  }
  EXPECT_EQ(Score(earlier), base);
  // The last row of query head 5 (KV head 2) changes KV head 0's scores too.
  oracle::AttentionProblem other_group = pb;
  for (int64_t i = 0; i < 8; ++i) other_group.queries[(5 * 4 + 3) * 8 + i] *= -2.0f;
  const std::vector<float> changed = Score(other_group);
  EXPECT_NE(std::vector<float>(changed.begin(), changed.begin() + 40),
            std::vector<float>(base.begin(), base.begin() + 40));
}

TEST(TovaTest, DeterministicAcrossThreadCounts) {
  const oracle::AttentionProblem pb = oracle::RandomProblem(33, 7, 4, 64, 16, 2, 2.0);
  EXPECT_EQ(Score(pb, 1), Score(pb, 4));
}

}  // namespace
}  // namespace kvtrim
