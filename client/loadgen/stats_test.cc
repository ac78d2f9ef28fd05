// Tests of the load generator's percentile and summary helpers.
#include "client/loadgen/stats.h"

#include <gtest/gtest.h>

namespace kvtrim::loadgen {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  const std::vector<double> sorted = {1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(Percentile(sorted, 0.0), 1);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 0.5), 3);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 1.0), 5);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 0.25), 2);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 0.99), 4.96);  // position 3.96
  EXPECT_DOUBLE_EQ(Percentile({10, 20}, 0.5), 15);
}

TEST(PercentileTest, EdgeCases) {
  EXPECT_DOUBLE_EQ(Percentile({}, 0.5), 0);
  EXPECT_DOUBLE_EQ(Percentile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(Percentile({1, 2}, -1), 1);  // clamped
  EXPECT_DOUBLE_EQ(Percentile({1, 2}, 2), 2);   // clamped
}

TEST(SummarizeTest, SortsAndSummarises) {
  std::vector<double> samples;
  for (int i = 100; i >= 1; --i) samples.push_back(i);  // descending: must be sorted first
  const Summary summary = Summarize(samples);
  EXPECT_EQ(summary.count, 100);
  EXPECT_DOUBLE_EQ(summary.mean, 50.5);
  EXPECT_DOUBLE_EQ(summary.p50, 50.5);
  EXPECT_DOUBLE_EQ(summary.p99, 99.01);  // position 98.01
  EXPECT_DOUBLE_EQ(summary.min, 1);
  EXPECT_DOUBLE_EQ(summary.max, 100);
}

TEST(SummarizeTest, EmptyIsAllZero) {
  const Summary summary = Summarize({});
  EXPECT_EQ(summary.count, 0);
  EXPECT_EQ(summary.mean, 0);
  EXPECT_EQ(summary.p99, 0);
}

}  // namespace
}  // namespace kvtrim::loadgen
