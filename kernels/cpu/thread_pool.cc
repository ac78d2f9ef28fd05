#include "kernels/cpu/thread_pool.h"

namespace kvtrim {

namespace {
// True on threads that are currently inside a ParallelFor body of some pool.
thread_local bool in_parallel_body = false;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int threads = num_threads > 1 ? num_threads : 1;
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  const bool was_inside = in_parallel_body;
  in_parallel_body = true;
  while (true) {
    int64_t i;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= count_) break;
      i = next_++;
    }
    (*body_)(i);
    bool last;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last = --remaining_ == 0;
    }
    if (last) done_cv_.notify_all();
  }
  in_parallel_body = was_inside;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
  }
}

void ThreadPool::ParallelFor(int64_t count, const std::function<void(int64_t)>& body) {
  if (count <= 0) return;
  if (in_parallel_body) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  std::lock_guard<std::mutex> loop_lock(loop_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    next_ = 0;
    remaining_ = count;
    ++generation_;
  }
  if (count == 1) {
    work_cv_.notify_one();
  } else {
    work_cv_.notify_all();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return remaining_ == 0; });
  body_ = nullptr;
}

}  // namespace kvtrim
