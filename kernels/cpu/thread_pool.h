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
/// inside a loop body (nested calls run inline).
class ThreadPool {
 public:
  /// `num_threads` <= 1 runs everything inline on the caller.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Calls body(i) for i in [0, count), spread over the threads; returns when all are done.
  void ParallelFor(int64_t count, const std::function<void(int64_t)>& body);

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

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
