// A fixed pool of worker threads for the CPU backend's data-parallel loops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtrim {

/// Runs ParallelFor loops on a fixed set of threads. One loop runs at a time per pool;
/// concurrent callers queue. Safe to call from any thread, but not re-entrantly from
/// inside a loop body (nested calls run inline). Loop bodies run only on the pool's own
/// threads, never on the caller's: the kernels' per-thread scratch (thread_local buffers
/// sized to the largest layer a thread has computed) then exists on these threads only,
/// not on every service thread that ever asked for a layer.
class ThreadPool {
 public:
  /// max(1, num_threads) threads; the caller of ParallelFor waits while they run the loop.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Calls body(i) for i in [0, count), spread over the threads; returns when all are done.
  void ParallelFor(int64_t count, const std::function<void(int64_t)>& body);

  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex loop_mutex_;  // serialises loops
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t next_ = 0;
  int64_t remaining_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace kvtrim
