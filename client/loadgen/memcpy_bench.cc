#include "client/loadgen/memcpy_bench.h"

#include "absl/synchronization/barrier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace kvtrim::loadgen {

MemcpyBandwidth MeasureMemcpy(size_t buffer_bytes, int repeats, int threads) {
  MemcpyBandwidth result;
  result.buffer_bytes = buffer_bytes;
  result.repeats = repeats;
  result.threads = threads;
  if (buffer_bytes == 0 || repeats < 1 || threads < 1) return result;
  using Clock = std::chrono::steady_clock;
  // Each round: every thread waits at the round's barrier, so the copies start together;
  // the round lasts from the first thread's start to the last one's end.
  std::vector<std::unique_ptr<absl::Barrier>> rounds;
  for (int i = 0; i < repeats; ++i) rounds.push_back(std::make_unique<absl::Barrier>(threads));
  using Times = std::vector<Clock::time_point>;
  std::vector<Times> starts(static_cast<size_t>(threads), Times(static_cast<size_t>(repeats)));
  std::vector<Times> ends = starts;
  auto copier = [&](int t) {
    std::unique_ptr<char[]> source(new char[buffer_bytes]);
    std::unique_ptr<char[]> target(new char[buffer_bytes]);
    std::memset(source.get(), 1, buffer_bytes);  // touch every page of both buffers
    std::memset(target.get(), 0, buffer_bytes);
    for (int i = 0; i < repeats; ++i) {
      rounds[static_cast<size_t>(i)]->Block();
      starts[static_cast<size_t>(t)][static_cast<size_t>(i)] = Clock::now();
      std::memcpy(target.get(), source.get(), buffer_bytes);
      ends[static_cast<size_t>(t)][static_cast<size_t>(i)] = Clock::now();
      // Read the copy back so that it is not optimised away.
      volatile char sink = target[buffer_bytes - 1];
      (void)sink;
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(copier, t);
  copier(0);
  for (std::thread& worker : workers) worker.join();
  for (size_t i = 0; i < static_cast<size_t>(repeats); ++i) {
    Clock::time_point start = starts[0][i], end = ends[0][i];
    for (size_t t = 1; t < static_cast<size_t>(threads); ++t) {
      start = std::min(start, starts[t][i]);
      end = std::max(end, ends[t][i]);
    }
    const double seconds = std::chrono::duration<double>(end - start).count();
    if (seconds > 0) {
      const double rate = static_cast<double>(buffer_bytes) * threads / seconds;
      result.best_bytes_per_s = std::max(result.best_bytes_per_s, rate);
    }
  }
  return result;
}

}  // namespace kvtrim::loadgen
