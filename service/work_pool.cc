#include "service/work_pool.h"

#include <algorithm>

namespace kvtrim::service {

WorkPool::WorkPool(int max_threads, std::chrono::milliseconds idle_timeout)
    : max_threads_(std::max(1, max_threads)), idle_timeout_(idle_timeout) {}

WorkPool::~WorkPool() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
  exited_.wait(lock, [this] { return threads_ == 0; });
  std::map<std::thread::id, std::thread> threads = std::move(running_);
  lock.unlock();
  for (auto& [id, thread] : threads) thread.join();
}

void WorkPool::JoinExited() {
  for (const std::thread::id& id : exited_ids_) {
    auto it = running_.find(id);
    if (it == running_.end()) continue;
    it->second.join();  // it has left Run() and only returns now
    running_.erase(it);
  }
  exited_ids_.clear();
}

void WorkPool::Post(Task task) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.push_back(std::move(task));
  if (idle_ > 0) {
    wake_.notify_one();
    return;
  }
  JoinExited();
  if (threads_ < max_threads_) {
    ++threads_;
    std::thread thread([this] { Run(); });
    running_.emplace(thread.get_id(), std::move(thread));
  }
  // Otherwise a busy thread takes it when it finishes its task.
}

int WorkPool::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return threads_;
}

void WorkPool::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (tasks_.empty()) {
      if (stopping_) break;
      ++idle_;
      const bool woken = wake_.wait_for(lock, idle_timeout_,
                                        [this] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (!woken) break;  // idle too long: this thread exits
      continue;
    }
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // captured state is released outside the lock
    lock.lock();
  }
  --threads_;
  exited_ids_.push_back(std::this_thread::get_id());
  exited_.notify_all();
}

void SerialLane::Post(WorkPool::Task task) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->tasks.push_back(std::move(task));
  if (state_->running) return;
  state_->running = true;
  state_->pool.Post([state = state_] { Drain(state); });
}

void SerialLane::RunOrPost(WorkPool::Task task) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->running || !state_->tasks.empty()) {
      state_->tasks.push_back(std::move(task));
      return;
    }
    state_->running = true;  // ours: tasks posted meanwhile wait behind it
  }
  std::shared_ptr<State> state = state_;  // the task may destroy the lane
  task();
  std::lock_guard<std::mutex> lock(state->mutex);
  if (state->tasks.empty()) {
    state->running = false;
  } else {
    state->pool.Post([state] { Drain(state); });  // what queued meanwhile, on the pool
  }
}

void SerialLane::Drain(const std::shared_ptr<State>& state) {
  while (true) {
    WorkPool::Task task;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (state->tasks.empty()) {
        state->running = false;
        return;
      }
      task = std::move(state->tasks.front());
      state->tasks.pop_front();
    }
    task();
  }
}

}  // namespace kvtrim::service
