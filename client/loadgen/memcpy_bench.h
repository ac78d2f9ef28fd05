// A same-run host memory bandwidth reference for the load generator's throughput numbers:
// one core copying, and every core copying at once (the host's memory bandwidth ceiling).
#pragma once

#include <cstddef>

namespace kvtrim::loadgen {

/// Host memcpy bandwidth measured in this process.
struct MemcpyBandwidth {
  size_t buffer_bytes = 0;      // bytes per copy (per thread)
  int repeats = 0;              // copies timed (per thread)
  int threads = 1;              // threads copying at once, each its own buffers
  double best_bytes_per_s = 0;  // fastest round: bytes copied by all threads / seconds
};

/// `threads` threads each copy their own `buffer_bytes` buffer (both buffers touched first)
/// `repeats` times with std::memcpy, all threads starting each round together; returns the
/// best round's bandwidth (bytes copied by all threads / the round's seconds). Memory
/// traffic is twice that (each byte read and written).
MemcpyBandwidth MeasureMemcpy(size_t buffer_bytes = size_t{256} << 20, int repeats = 5,
                              int threads = 1);

}  // namespace kvtrim::loadgen
