#include "client/loadgen/stats.h"

#include <algorithm>
#include <cmath>

namespace kvtrim::loadgen {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const double position = q * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return sorted[below] + fraction * (sorted[above] - sorted[below]);
}

Summary Summarize(std::vector<double> samples) {
  Summary summary;
  if (samples.empty()) return summary;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double sample : samples) sum += sample;
  summary.count = static_cast<int64_t>(samples.size());
  summary.mean = sum / static_cast<double>(samples.size());
  summary.p50 = Percentile(samples, 0.50);
  summary.p99 = Percentile(samples, 0.99);
  summary.min = samples.front();
  summary.max = samples.back();
  return summary;
}

}  // namespace kvtrim::loadgen
