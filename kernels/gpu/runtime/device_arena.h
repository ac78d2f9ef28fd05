// Reusable memory of one GPU worker: a device arena, pinned host buffers, and the layout
// that carves one request's buffers out of the arena.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace kvtrim::gpu {

/// Alignment of every region carved from an arena (bytes; covers 16-byte vector loads and
/// the 128-byte lines the kernels read).
inline constexpr size_t kArenaAlignment = 256;

/// Device memory of one worker, grown on demand and reused by every later request
/// (cudaMalloc, never managed memory; never shrunk). Not thread-safe: exactly one worker
/// context owns it and uses it from one request at a time.
class DeviceArena {
 public:
  /// `limit_bytes` caps the arena's capacity (0 = no cap but the device's free memory).
  explicit DeviceArena(size_t limit_bytes) : limit_bytes_(limit_bytes) {}
  /// Frees the device memory (the current device must be the arena's).
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  /// Makes at least `bytes` available at data(). Grows only when needed: frees the old
  /// buffer and allocates max(bytes, 1.25 x capacity) rounded up to 2 MiB (within the cap).
  /// The caller guarantees that no queued device work still uses the old buffer.
  /// Errors: RESOURCE_EXHAUSTED when `bytes` exceeds the cap or cudaMalloc runs out of
  /// memory (the arena is then empty and stays usable); INTERNAL for other CUDA errors.
  absl::Status Reserve(size_t bytes);

  /// Start of the arena (nullptr while empty).
  void* data() const { return data_; }
  /// Bytes allocated now.
  size_t capacity() const { return capacity_; }
  /// The cap given at construction (0 = none).
  size_t limit_bytes() const { return limit_bytes_; }

 private:
  size_t limit_bytes_;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

/// Page-locked host memory (cudaMallocHost) grown on demand, for asynchronous copies.
/// Not thread-safe (owned by one worker context).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  /// Frees the pinned memory.
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  /// Makes at least `bytes` available; the caller guarantees no queued copy still uses the
  /// old buffer. Errors: RESOURCE_EXHAUSTED when pinned memory runs out, INTERNAL otherwise.
  absl::Status Reserve(size_t bytes);
  /// Start of the buffer (nullptr while empty).
  char* data() const { return data_; }
  /// Bytes allocated now.
  size_t capacity() const { return capacity_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

/// Plans the regions of one request inside an arena: each region starts on a
/// kArenaAlignment boundary; offsets are relative to the arena's start.
class ArenaLayout {
 public:
  /// Appends a region of `bytes` (0 allowed: an empty region at an aligned offset);
  /// returns its offset.
  size_t Add(size_t bytes);
  /// Bytes the planned regions occupy, the last one's alignment padding included.
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

/// Rounds `bytes` up to a multiple of `alignment` (a power of two).
constexpr size_t AlignUp(size_t bytes, size_t alignment) {
  return (bytes + alignment - 1) & ~(alignment - 1);
}

}  // namespace kvtrim::gpu
