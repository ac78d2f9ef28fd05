// Large host byte buffers kept for reuse. A layer read from a host shared-memory segment or
// assembled from chunks is tens to hundreds of MiB; in freshly allocated memory every page
// faults and is zeroed on first touch (half the cost of a shm read). The pool hands the
// buffers of finished layers to the next ones, whose pages are already mapped. With a GPU
// backend the pooled buffers are also page-locked once, when created, so that a layer sent
// in chunks goes to the device by one DMA from the buffer it was received into.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace kvtrim::service {

class HostBufferPool;

/// One uninitialised buffer of uint32 words, from a HostBufferPool or the heap; goes back to
/// its pool (or is freed) when destroyed. Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&&) = default;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  /// The words (nullptr when empty).
  uint32_t* get() const { return words_.get(); }
  /// Capacity in bytes.
  size_t capacity_bytes() const { return capacity_words_ * 4; }
  /// True when the buffer is page-locked for the devices (HostMemoryLocker).
  bool page_locked() const { return page_locked_; }
  explicit operator bool() const { return words_ != nullptr; }

 private:
  friend class HostBufferPool;
  HostBuffer(std::unique_ptr<uint32_t[]> words, size_t capacity_words,
             std::shared_ptr<HostBufferPool> pool, bool page_locked = false)
      : words_(std::move(words)),
        capacity_words_(capacity_words),
        page_locked_(page_locked),
        pool_(std::move(pool)) {}
  /// Gives the words back to the pool (or frees them).
  void Release();

  std::unique_ptr<uint32_t[]> words_;
  size_t capacity_words_ = 0;
  bool page_locked_ = false;
  std::shared_ptr<HostBufferPool> pool_;  // null: a heap buffer
};

/// Page-locks host memory for the devices' copy engines and undoes it (a DeviceMapper's
/// LockHost / UnlockHost). Empty functions: nothing is locked.
struct HostMemoryLocker {
  std::function<bool(void* data, size_t bytes)> lock;  // true when locked
  std::function<void(void* data)> unlock;
};

/// The pool: idle buffers by capacity, at most `max_idle_bytes` of them together. Buffers
/// under `min_pooled_bytes` come from the heap and are not kept. With a `locker`, each new
/// pooled buffer is page-locked while the locked buffers (idle or in use) stay within
/// `max_locked_bytes`, and unlocked when freed. ExpireIdle frees the buffers idle for
/// longer than `idle_lifetime` (zero: none), so that what the pool keeps follows the recent
/// load, not the largest it ever saw. Thread-safe; create it with std::make_shared (buffers
/// hold a reference to it).
class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  using Clock = std::chrono::steady_clock;
  /// Capacities are rounded up to this (similar sizes share buffers).
  static constexpr size_t kGranuleBytes = size_t{2} << 20;

  explicit HostBufferPool(size_t max_idle_bytes, size_t min_pooled_bytes = size_t{1} << 20,
                          HostMemoryLocker locker = {}, size_t max_locked_bytes = 0,
                          Clock::duration idle_lifetime = Clock::duration::zero())
      : max_idle_bytes_(max_idle_bytes),
        min_pooled_bytes_(min_pooled_bytes),
        locker_(std::move(locker)),
        max_locked_bytes_(locker_.lock ? max_locked_bytes : 0),
        idle_lifetime_(idle_lifetime) {}
  /// Unlocks and frees the idle buffers.
  ~HostBufferPool();

  /// A buffer of at least `bytes`: an idle one when one fits (the smallest of at most twice
  /// the size; of those, the one given back last), else a new one.
  HostBuffer Acquire(size_t bytes);

  /// A buffer of at least `bytes` from the heap, freed when destroyed (no pool).
  static HostBuffer FromHeap(size_t bytes);

  /// Unlocks and frees the buffers idle since before `now - idle_lifetime` (none when the
  /// lifetime is zero); returns the bytes freed.
  size_t ExpireIdle(Clock::time_point now = Clock::now());

  /// Bytes held by idle buffers now.
  size_t idle_bytes() const;
  /// Bytes of the pooled buffers handed out and not yet given back (heap buffers of
  /// FromHeap and those under `min_pooled_bytes` are not counted).
  size_t in_use_bytes() const;
  /// Buffers handed out that were reused (not newly allocated), since construction.
  uint64_t reused() const;
  /// Bytes of page-locked buffers, idle or in use.
  size_t locked_bytes() const;

 private:
  friend class HostBuffer;
  /// An idle buffer.
  struct Idle {
    std::unique_ptr<uint32_t[]> words;
    bool page_locked = false;
    Clock::time_point since;  // when it was given back
  };
  /// Keeps `words` for reuse while the idle bytes stay within the cap; unlocks and frees
  /// it otherwise.
  void Release(std::unique_ptr<uint32_t[]> words, size_t capacity_words, bool page_locked);
  /// Page-locks a new buffer of `capacity_bytes` when the cap leaves room and the locker
  /// succeeds.
  bool TryLock(uint32_t* words, size_t capacity_bytes);

  const size_t max_idle_bytes_;
  const size_t min_pooled_bytes_;
  const HostMemoryLocker locker_;
  const size_t max_locked_bytes_;  // 0: nothing is locked
  const Clock::duration idle_lifetime_;  // zero: idle buffers are kept until reused
  mutable std::mutex mutex_;
  std::multimap<size_t, Idle> idle_;  // by capacity in words
  size_t idle_bytes_ = 0;
  size_t in_use_bytes_ = 0;
  size_t locked_bytes_ = 0;
  uint64_t reused_ = 0;
};

/// A buffer of at least `bytes` from `pool`, or from the heap when `pool` is null.
HostBuffer AcquireHostBuffer(const std::shared_ptr<HostBufferPool>& pool, size_t bytes);

}  // namespace kvtrim::service
