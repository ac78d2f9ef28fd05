// Returning freed heap memory to the system (glibc malloc): under sustained load kvtrimd's
// requests come and go in sizes glibc's self-adjusting mmap threshold ends up serving from
// the arenas, and freed arena memory is kept; RSS then grows for minutes with no leak
// (docs/reliability.md, "Soak"). kvtrimd fixes the threshold and trims periodically.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace kvtrim::service {

/// Serves allocations of at least 256 KiB (request and tensor buffers) with mmap, so their
/// memory goes back to the system when freed, unless the operator set
/// MALLOC_MMAP_THRESHOLD_ in the environment. Call once at start-up, before threads start.
void TuneAllocator();

/// What glibc malloc holds now (mallinfo2, every arena): bytes in allocated chunks of the
/// arenas, bytes in their free chunks (kept, not given back), and bytes of the allocations
/// served by mmap.
struct HeapUsage {
  uint64_t in_use_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t mmapped_bytes = 0;
};

/// The heap's figures now (locks each arena in turn: call it every few seconds, not per
/// request).
HeapUsage ReadHeapUsage();

/// A thread calling `before_trim` (may be empty: e.g. freeing caches idle too long) and
/// then malloc_trim(0) every `period` (freed arena memory back to the system), then
/// `after_trim` (may be empty: e.g. publishing memory figures), stopped and joined by the
/// destructor.
class MemoryTrimmer {
 public:
  explicit MemoryTrimmer(std::chrono::milliseconds period,
                         std::function<void()> before_trim = nullptr,
                         std::function<void()> after_trim = nullptr);
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  /// Trims done so far (tests).
  int trims() const;

 private:
  std::chrono::milliseconds period_;
  std::function<void()> before_trim_;
  std::function<void()> after_trim_;
  mutable std::mutex mutex_;
  std::condition_variable stop_requested_;
  bool stop_ = false;
  int trims_ = 0;
  std::thread thread_;
};

}  // namespace kvtrim::service
