#include "kernels/thread_pool.h"

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
  work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  in_parallel_body = true;  // nested ParallelFor calls from a body run inline
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_.wait(lock, [this] { return stop_ || !loops_.empty(); });
    if (stop_) return;
    Loop* loop = loops_.front();
    const int64_t i = loop->next++;
    if (loop->next == loop->count) loops_.pop_front();
    lock.unlock();
    (*loop->body)(i);
    lock.lock();
    // Notified under the lock: the caller may return (and destroy `loop`) right after.
    if (--loop->remaining == 0) loop->done.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t count, const std::function<void(int64_t)>& body) {
  if (count <= 0) return;
  if (in_parallel_body) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  Loop loop;
  loop.body = &body;
  loop.count = count;
  loop.remaining = count;
  std::unique_lock<std::mutex> lock(mutex_);
  loops_.push_back(&loop);
  if (count == 1) {
    work_.notify_one();
  } else {
    work_.notify_all();
  }
  loop.done.wait(lock, [&loop] { return loop.remaining == 0; });
}

}  // namespace kvtrim
