// The process metrics every Prometheus client library exports (process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
// process_max_fds, process_start_time_seconds), read from /proc/self at each scrape;
// prometheus-cpp has no such collector.
#pragma once

#include <optional>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace kvtrim::service {

/// One reading of this process's figures from /proc.
struct ProcessFigures {
  double cpu_seconds = 0;         // user + system CPU time
  double resident_bytes = 0;      // RSS
  double virtual_bytes = 0;       // address space
  double open_fds = 0;            // entries of /proc/self/fd
  double max_fds = 0;             // the soft RLIMIT_NOFILE
  double start_time_seconds = 0;  // since the Unix epoch
};

/// Reads ProcessFigures from /proc/self (nullopt where /proc cannot be read).
std::optional<ProcessFigures> ReadProcessFigures();

/// A collectable for the metrics exposer: the process_* families of ReadProcessFigures at
/// every scrape (none when /proc cannot be read). Thread-safe (stateless).
class ProcessCollector : public prometheus::Collectable {
 public:
  /// The six process_* families.
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace kvtrim::service
