#include "client/loadgen/memcpy_bench.h"

#include <chrono>
#include <cstring>
#include <memory>

namespace kvtrim::loadgen {

MemcpyBandwidth MeasureMemcpy(size_t buffer_bytes, int repeats) {
  MemcpyBandwidth result;
  result.buffer_bytes = buffer_bytes;
  result.repeats = repeats;
  if (buffer_bytes == 0 || repeats < 1) return result;
  std::unique_ptr<char[]> source(new char[buffer_bytes]);
  std::unique_ptr<char[]> target(new char[buffer_bytes]);
  std::memset(source.get(), 1, buffer_bytes);  // touch every page of both buffers
  std::memset(target.get(), 0, buffer_bytes);
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(target.get(), source.get(), buffer_bytes);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Read the copy back so that it is not optimised away.
    volatile char sink = target[buffer_bytes - 1];
    (void)sink;
    if (seconds > 0) {
      const double rate = static_cast<double>(buffer_bytes) / seconds;
      if (rate > result.best_bytes_per_s) result.best_bytes_per_s = rate;
    }
  }
  return result;
}

}  // namespace kvtrim::loadgen
