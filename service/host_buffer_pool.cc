#include "service/host_buffer_pool.h"

#include <iterator>
#include <vector>

namespace kvtrim::service {

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    words_ = std::move(other.words_);
    capacity_words_ = other.capacity_words_;
    page_locked_ = other.page_locked_;
    pool_ = std::move(other.pool_);
  }
  return *this;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() {
  if (words_ != nullptr && pool_ != nullptr) {
    pool_->Release(std::move(words_), capacity_words_, page_locked_);
  }
  words_.reset();
  pool_.reset();
  capacity_words_ = 0;
  page_locked_ = false;
}

HostBuffer HostBufferPool::FromHeap(size_t bytes) {
  const size_t words = (bytes + 3) / 4;
  return HostBuffer(std::unique_ptr<uint32_t[]>(new uint32_t[words == 0 ? 1 : words]), words,
                    nullptr);
}

HostBuffer HostBufferPool::Acquire(size_t bytes) {
  const size_t words = (bytes + 3) / 4;
  if (bytes < min_pooled_bytes_) return FromHeap(bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = idle_.lower_bound(words);
    if (it != idle_.end() && it->first <= 2 * words) {
      const size_t capacity = it->first;
      // Of the buffers of this capacity, the one given back last (the end of its equal
      // range): taking the oldest would cycle through all of them and keep every one from
      // expiring, so a burst's surplus would stay for good.
      it = std::prev(idle_.upper_bound(capacity));
      Idle reused = std::move(it->second);
      idle_.erase(it);
      idle_bytes_ -= capacity * 4;
      in_use_bytes_ += capacity * 4;
      ++reused_;
      return HostBuffer(std::move(reused.words), capacity, shared_from_this(),
                        reused.page_locked);
    }
  }
  const size_t granule_words = kGranuleBytes / 4;
  const size_t capacity = (words + granule_words - 1) / granule_words * granule_words;
  std::unique_ptr<uint32_t[]> fresh(new uint32_t[capacity]);
  const bool locked = TryLock(fresh.get(), capacity * 4);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_bytes_ += capacity * 4;
  }
  return HostBuffer(std::move(fresh), capacity, shared_from_this(), locked);
}

bool HostBufferPool::TryLock(uint32_t* words, size_t capacity_bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (locked_bytes_ + capacity_bytes > max_locked_bytes_) return false;
    locked_bytes_ += capacity_bytes;  // reserved while the driver locks it
  }
  if (locker_.lock(words, capacity_bytes)) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  locked_bytes_ -= capacity_bytes;
  return false;
}

void HostBufferPool::Release(std::unique_ptr<uint32_t[]> words, size_t capacity_words,
                             bool page_locked) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_bytes_ -= capacity_words * 4;
    if (idle_bytes_ + capacity_words * 4 <= max_idle_bytes_) {
      idle_bytes_ += capacity_words * 4;
      idle_.emplace(capacity_words, Idle{std::move(words), page_locked, Clock::now()});
      return;
    }
    if (page_locked) locked_bytes_ -= capacity_words * 4;
  }
  if (page_locked) locker_.unlock(words.get());
}  // freed on return

HostBufferPool::~HostBufferPool() {
  for (auto& [capacity, idle] : idle_) {
    if (idle.page_locked) locker_.unlock(idle.words.get());
  }
}

size_t HostBufferPool::ExpireIdle(Clock::time_point now) {
  if (idle_lifetime_ == Clock::duration::zero()) return 0;
  std::vector<Idle> expired;
  size_t freed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (now - it->second.since <= idle_lifetime_) {
        ++it;
        continue;
      }
      const size_t bytes = it->first * 4;
      idle_bytes_ -= bytes;
      if (it->second.page_locked) locked_bytes_ -= bytes;
      freed += bytes;
      expired.push_back(std::move(it->second));
      it = idle_.erase(it);
    }
  }
  for (Idle& idle : expired) {
    if (idle.page_locked) locker_.unlock(idle.words.get());
  }
  return freed;  // `expired` frees the words on return
}

size_t HostBufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

size_t HostBufferPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_bytes_;
}

uint64_t HostBufferPool::reused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reused_;
}

size_t HostBufferPool::locked_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return locked_bytes_;
}

HostBuffer AcquireHostBuffer(const std::shared_ptr<HostBufferPool>& pool, size_t bytes) {
  return pool != nullptr ? pool->Acquire(bytes) : HostBufferPool::FromHeap(bytes);
}

}  // namespace kvtrim::service
