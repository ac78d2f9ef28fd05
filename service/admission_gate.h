// A counting limit on concurrent calls (--max_inflight, --max_leases) whose callers may wait
// a bounded time for a slot.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

namespace kvtrim::service {

/// `limit` slots. A caller takes one at once (TryAcquire) or, when none is free, may queue
/// as one of at most `max_waiters` waiters (StartWaiting, then AwaitSlot) until a slot is
/// given back, its deadline passes or it gives up. Slots go to whoever asks first after a
/// Release, a new arrival included: the wait absorbs short bursts (a cancelled call whose
/// cancellation the server has not yet seen), it is not a fair queue. Thread-safe.
class AdmissionGate {
 public:
  using Clock = std::chrono::steady_clock;

  AdmissionGate(int limit, int max_waiters) : limit_(limit), max_waiters_(max_waiters) {}
  AdmissionGate(const AdmissionGate&) = delete;
  AdmissionGate& operator=(const AdmissionGate&) = delete;

  int limit() const { return limit_; }
  /// Slots held now.
  int in_use() const { return in_use_.load(); }
  /// Callers waiting now.
  int waiting() const { return waiters_.load(); }

  /// Takes a slot if one is free now.
  bool TryAcquire();
  /// Becomes a waiter when fewer than max_waiters wait (false: refuse at once). Every true
  /// must be followed by exactly one AwaitSlot or StopWaiting.
  bool StartWaiting();
  /// Blocks until a slot is taken (true), `deadline` passes or `give_up()` holds (false;
  /// polled at least every 10 ms). Ends the wait begun by StartWaiting.
  bool AwaitSlot(Clock::time_point deadline, const std::function<bool()>& give_up);
  /// Ends a wait begun by StartWaiting without waiting (instead of AwaitSlot).
  void StopWaiting() { waiters_.fetch_sub(1); }
  /// Gives a slot back and wakes a waiter.
  void Release();

 private:
  const int limit_;
  const int max_waiters_;
  std::atomic<int> in_use_{0};
  std::atomic<int> waiters_{0};
  std::mutex mutex_;              // taken by waiters around their check, and by Release
  std::condition_variable freed_;  // a slot was given back
};

}  // namespace kvtrim::service
