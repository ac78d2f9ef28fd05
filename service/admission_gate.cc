#include "service/admission_gate.h"

#include <algorithm>

namespace kvtrim::service {

bool AdmissionGate::TryAcquire() {
  int current = in_use_.load();
  while (current < limit_) {
    if (in_use_.compare_exchange_weak(current, current + 1)) return true;
  }
  return false;
}

bool AdmissionGate::StartWaiting() {
  int current = waiters_.load();
  while (current < max_waiters_) {
    if (waiters_.compare_exchange_weak(current, current + 1)) return true;
  }
  return false;
}

bool AdmissionGate::AwaitSlot(Clock::time_point deadline, const std::function<bool()>& give_up) {
  constexpr auto kPoll = std::chrono::milliseconds(10);
  bool taken = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!(taken = TryAcquire())) {
      const auto now = Clock::now();
      if (now >= deadline || give_up()) break;
      // Release() takes mutex_ after freeing its slot, so no wake-up falls between the
      // failed TryAcquire above and this wait.
      freed_.wait_until(lock, std::min(deadline, now + kPoll));
    }
  }
  waiters_.fetch_sub(1);
  return taken;
}

void AdmissionGate::Release() {
  in_use_.fetch_sub(1);
  if (waiters_.load() == 0) return;
  { std::lock_guard<std::mutex> lock(mutex_); }
  freed_.notify_one();
}

}  // namespace kvtrim::service
