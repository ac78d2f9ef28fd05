// Fetches and parses a Prometheus text exposition for end-to-end tests.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtrim::testing {

/// An HTTP/1.0 GET of http://host:port/path over a plain socket. Returns the body of a
/// 200 response; UNAVAILABLE when the connection fails, INTERNAL for another status.
absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path);

/// One sample line: metric name, labels and value.
struct Sample {
  std::string name;                          // e.g. "kvtrim_kept_ratio_count"
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// The samples of a text exposition (comments and blank lines skipped).
/// INVALID_ARGUMENT naming the line that does not parse.
absl::StatusOr<std::vector<Sample>> ParseExposition(const std::string& text);

/// Query helpers over a parsed exposition.
class MetricsSnapshot {
 public:
  explicit MetricsSnapshot(std::vector<Sample> samples) : samples_(std::move(samples)) {}

  /// Number of series named `name` whose labels include every pair of `labels`.
  int Count(const std::string& name, const std::map<std::string, std::string>& labels) const;
  /// Sum of the values of those series (0 when there is none).
  double Sum(const std::string& name, const std::map<std::string, std::string>& labels) const;

 private:
  std::vector<Sample> samples_;
};

}  // namespace kvtrim::testing
