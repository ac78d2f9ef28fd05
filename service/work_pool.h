// The threads that run the service's blocking work (decoding, compute, model storage) off
// gRPC's callback threads, and the ordered lanes that calls use on them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtrim::service {

/// A thread pool that grows on demand up to `max_threads` and lets threads idle longer
/// than `idle_timeout` exit, so an idle server holds no threads of its own. Tasks run in
/// the order they were posted (FIFO across the pool). Thread-safe. The destructor runs
/// every task already posted, then joins the threads.
class WorkPool {
 public:
  using Task = std::function<void()>;

  explicit WorkPool(int max_threads,
                    std::chrono::milliseconds idle_timeout = std::chrono::seconds(10));
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  /// Queues `task`; starts a thread when none is idle and fewer than max_threads run.
  void Post(Task task);
  /// Threads alive now (busy or idle).
  int threads() const;

 private:
  /// Thread body: runs tasks until stopping, or until idle for idle_timeout.
  void Run();
  /// Joins the threads that have exited (mutex_ held; they no longer touch the pool).
  void JoinExited();

  const int max_threads_;
  const std::chrono::milliseconds idle_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable exited_;
  std::deque<Task> tasks_;
  std::map<std::thread::id, std::thread> running_;  // every thread not yet joined
  std::vector<std::thread::id> exited_ids_;         // threads that left Run()
  int threads_ = 0;
  int idle_ = 0;
  bool stopping_ = false;
};

/// Runs tasks posted to it one at a time, in order, on a WorkPool: the serial half of a
/// call (a session's front end, its compute). Holds no thread while empty. Thread-safe.
/// A task may destroy the lane (e.g. by deleting the reactor that owns it): the queue's
/// state lives as long as a pool task still drains it.
class SerialLane {
 public:
  explicit SerialLane(WorkPool& pool) : state_(std::make_shared<State>(pool)) {}
  SerialLane(const SerialLane&) = delete;
  SerialLane& operator=(const SerialLane&) = delete;

  /// Queues `task` after every task posted before it.
  void Post(WorkPool::Task task);
  /// Runs `task` on the calling thread when the lane is idle (no task queued or running),
  /// else queues it like Post. For short tasks on threads that must not block long.
  void RunOrPost(WorkPool::Task task);

 private:
  /// The queue, shared with the pool task that drains it.
  struct State {
    explicit State(WorkPool& pool) : pool(pool) {}
    WorkPool& pool;
    std::mutex mutex;
    std::deque<WorkPool::Task> tasks;
    bool running = false;
  };
  /// Runs queued tasks until the queue is empty (one pool task at a time).
  static void Drain(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
};

}  // namespace kvtrim::service
