#include "service/host_buffer_pool.h"

namespace kvtrim::service {

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    words_ = std::move(other.words_);
    capacity_words_ = other.capacity_words_;
    pool_ = std::move(other.pool_);
  }
  return *this;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() {
  if (words_ != nullptr && pool_ != nullptr) pool_->Release(std::move(words_), capacity_words_);
  words_.reset();
  pool_.reset();
  capacity_words_ = 0;
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
      std::unique_ptr<uint32_t[]> reused = std::move(it->second);
      idle_.erase(it);
      idle_bytes_ -= capacity * 4;
      ++reused_;
      return HostBuffer(std::move(reused), capacity, shared_from_this());
    }
  }
  const size_t granule_words = kGranuleBytes / 4;
  const size_t capacity = (words + granule_words - 1) / granule_words * granule_words;
  return HostBuffer(std::unique_ptr<uint32_t[]>(new uint32_t[capacity]), capacity,
                    shared_from_this());
}

void HostBufferPool::Release(std::unique_ptr<uint32_t[]> words, size_t capacity_words) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_bytes_ + capacity_words * 4 > max_idle_bytes_) return;  // freed on return
  idle_bytes_ += capacity_words * 4;
  idle_.emplace(capacity_words, std::move(words));
}

size_t HostBufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

uint64_t HostBufferPool::reused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reused_;
}

HostBuffer AcquireHostBuffer(const std::shared_ptr<HostBufferPool>& pool, size_t bytes) {
  return pool != nullptr ? pool->Acquire(bytes) : HostBufferPool::FromHeap(bytes);
}

}  // namespace kvtrim::service
