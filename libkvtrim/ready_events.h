// Ready events of the in-process engine: a CUDA event recorded on the caller's stream, which
// the backend's stream waits on before reading the caller's device tensors. Events are
// reused across calls (creating and destroying one per call costs microseconds per layer).
#pragma once

#include <mutex>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtrim::inprocess {

class ReadyEventPool;

/// One ready event recorded for a call; goes back to its pool when destroyed (the backend
/// has enqueued its wait by then; a later record does not change a wait already enqueued).
class ReadyEvent {
 public:
  ReadyEvent() = default;
  ReadyEvent(ReadyEventPool* pool, void* event) : pool_(pool), event_(event) {}
  ReadyEvent(const ReadyEvent&) = delete;
  ReadyEvent& operator=(const ReadyEvent&) = delete;
  ReadyEvent(ReadyEvent&& other) noexcept : pool_(other.pool_), event_(other.event_) {
    other.event_ = nullptr;
  }
  ReadyEvent& operator=(ReadyEvent&& other) noexcept;
  ~ReadyEvent();

  /// The cudaEvent_t, or null when none was recorded.
  void* get() const { return event_; }

 private:
  ReadyEventPool* pool_ = nullptr;
  void* event_ = nullptr;
};

/// The reusable events of one CUDA device. Thread-safe.
class ReadyEventPool {
 public:
  explicit ReadyEventPool(int device) : device_(device) {}
  ReadyEventPool(const ReadyEventPool&) = delete;
  ReadyEventPool& operator=(const ReadyEventPool&) = delete;
  ~ReadyEventPool();

  /// An event of this pool recorded on `stream` (a cudaStream_t of the pool's device);
  /// INTERNAL "cuda_stream: ..." naming the CUDA error otherwise.
  absl::StatusOr<ReadyEvent> Record(void* stream);

 private:
  friend class ReadyEvent;
  /// Returns an event to the pool.
  void Release(void* event);

  const int device_;
  std::mutex mutex_;
  std::vector<void*> free_;  // guarded by mutex_
};

}  // namespace kvtrim::inprocess
