// Summary statistics of the load generator's samples (latencies, wall times).
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::loadgen {

/// Count, mean, median, 99th percentile and extremes of a set of samples.
struct Summary {
  int64_t count = 0;
  double mean = 0;
  double p50 = 0;
  double p99 = 0;
  double min = 0;
  double max = 0;
};

/// The q-quantile (q in [0, 1]) of `sorted` (ascending, non-empty) by linear interpolation
/// between the closest ranks: position q * (count - 1), as numpy.percentile's default.
/// q outside [0, 1] is clamped; an empty input gives 0.
double Percentile(const std::vector<double>& sorted, double q);

/// The summary of `samples` (any order); all zeros for no samples.
Summary Summarize(std::vector<double> samples);

}  // namespace kvtrim::loadgen
