// Conformance tests of the StreamingLLM scorer (specs/baselines.md §1) on the CPU: the score
// is the position, in every head, and never ties. Found through the CPU scorer table.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_layer.h"
#include "tests/testing/cpu_keys_layer.h"

namespace kvtrim {
namespace {

using testing::RandomKeysLayer;
using testing::RunCpuScorer;
using testing::TableScorer;

TEST(StreamingLlmScore, ScoreIsThePositionInEveryHead) {
  const CpuLayer layer = RandomKeysLayer(3, 1001, 4, 1);
  const std::vector<float> s = RunCpuScorer(TableScorer("streaming_llm"), layer, 2);
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t j = 0; j < 1001; ++j) {
      ASSERT_EQ(s[h * 1001 + j], static_cast<float>(j)) << "head " << h << " token " << j;
    }
  }
}

TEST(StreamingLlmScore, PositionsUpToTheTokenLimitNeverTie) {
  // EngineLimits::max_tokens = 2^22: float(j) must stay exact, so newer is strictly higher.
  const int64_t last = int64_t{1} << 22;
  EXPECT_LT(static_cast<float>(last - 2), static_cast<float>(last - 1));
  EXPECT_EQ(static_cast<int64_t>(static_cast<float>(last - 1)), last - 1);
}

}  // namespace
}  // namespace kvtrim
