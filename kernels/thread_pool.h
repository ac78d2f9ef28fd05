// A fixed pool of worker threads for the CPU backend's data-parallel loops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtrim {

/// Runs ParallelFor loops on a fixed set of threads. Loops of concurrent callers share the
/// threads: chunks are taken loop after loop in the order the loops arrived, so a thread
/// never idles while any loop has a chunk left (a one-chunk loop does not hold the others
/// up). Safe to call from any thread; a nested call from inside a loop body runs inline.
/// Loop bodies run only on the pool's own threads, never on the caller's: the kernels'
/// per-thread scratch (thread_local buffers sized to the largest layer a thread has
/// computed) then exists on these threads only, not on every service thread that ever
/// asked for a layer.
class ThreadPool {
 public:
  /// max(1, num_threads) threads; the caller of ParallelFor waits while they run its loop.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Calls body(i) for i in [0, count), spread over the threads; returns when all are done.
  void ParallelFor(int64_t count, const std::function<void(int64_t)>& body);

  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  /// One caller's loop, on its stack while it waits.
  struct Loop {
    const std::function<void(int64_t)>* body = nullptr;
    int64_t count = 0;
    int64_t next = 0;       // the next chunk to hand out
    int64_t remaining = 0;  // chunks not yet finished
    std::condition_variable done;
  };

  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex mutex_;               // guards what follows and every queued Loop's counters
  std::condition_variable work_;   // a loop was queued, or stop
  std::deque<Loop*> loops_;        // loops with chunks left to hand out, oldest first
  bool stop_ = false;
};

}  // namespace kvtrim
