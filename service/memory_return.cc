#include "service/memory_return.h"

#include <malloc.h>

#include <cstdlib>
#include <utility>

namespace kvtrim::service {

void TuneAllocator() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return;  // the operator's choice
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
}

HeapUsage ReadHeapUsage() {
  const struct mallinfo2 info = mallinfo2();
  HeapUsage usage;
  usage.in_use_bytes = info.uordblks;
  usage.free_bytes = info.fordblks;
  usage.mmapped_bytes = info.hblkhd;
  return usage;
}

MemoryTrimmer::MemoryTrimmer(std::chrono::milliseconds period,
                             std::function<void()> before_trim,
                             std::function<void()> after_trim)
    : period_(period), before_trim_(std::move(before_trim)), after_trim_(std::move(after_trim)) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_requested_.wait_for(lock, period_, [this] { return stop_; })) {
      lock.unlock();
      if (before_trim_) before_trim_();
      malloc_trim(0);
      if (after_trim_) after_trim_();
      lock.lock();
      ++trims_;
    }
  });
}

MemoryTrimmer::~MemoryTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_requested_.notify_all();
  thread_.join();
}

int MemoryTrimmer::trims() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trims_;
}

}  // namespace kvtrim::service
