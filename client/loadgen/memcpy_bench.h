// A same-run host memory bandwidth reference for the load generator's throughput numbers.
#pragma once

#include <cstddef>

namespace kvtrim::loadgen {

/// Host memcpy bandwidth measured in this process.
struct MemcpyBandwidth {
  size_t buffer_bytes = 0;      // bytes per copy
  int repeats = 0;              // copies timed
  double best_bytes_per_s = 0;  // fastest copy
};

/// Copies a `buffer_bytes` buffer (both buffers touched first) `repeats` times with
/// std::memcpy and returns the best bandwidth (bytes copied / seconds).
MemcpyBandwidth MeasureMemcpy(size_t buffer_bytes = size_t{256} << 20, int repeats = 5);

}  // namespace kvtrim::loadgen
