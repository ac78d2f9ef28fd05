// Device memory for the scores a model-wide policy keeps between layers on the GPU backend
// (Backend::ScoreLayerForModelWide -> LayerScores::resident -> DecideModelWide): one buffer per
// scored layer, allocated outside the worker arenas from a stream-ordered memory pool of the
// backend, counted against a byte cap, freed when the last reference goes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/decide/decide.h"

namespace kvtrim::gpu {

class DeviceScoreStore;

/// How a layer's LaProx candidates lie in a DeviceScoreBuffer.
struct ScoreBufferLayout {
  int64_t num_heads = 0;  // H_kv
  int64_t num_tokens = 0; // n
  int64_t sink = 0;       // protected tokens before the candidates (rule 3 clamped)
  int64_t recent = 0;     // protected tokens after them
  bool normalized = false;  // divided by the layer's canonical sum (LaProx mode model)
  /// Candidates per head: n - sink - recent.
  int64_t width() const { return num_tokens - sink - recent; }
};

/// One layer's LaProx candidates on the device: [H_kv, n - sink - recent] fp32, row-major
/// (head h's unprotected tokens sink .. n - recent - 1, raw or normalised). Written by the
/// backend that allocated it, read only afterwards. Holds its store alive.
class DeviceScoreBuffer final : public ResidentScores {
 public:
  /// Gives the memory back to the store (stream-ordered free; every reader has finished,
  /// since the backend synchronises each use).
  ~DeviceScoreBuffer() override;
  DeviceScoreBuffer(const DeviceScoreBuffer&) = delete;
  DeviceScoreBuffer& operator=(const DeviceScoreBuffer&) = delete;

  size_t bytes() const override { return bytes_; }
  /// [H_kv, width] fp32 device memory; null when empty.
  float* data() const { return data_; }
  /// The store it came from (a backend checks that it made the buffer).
  const DeviceScoreStore* store() const { return store_.get(); }
  const ScoreBufferLayout& layout() const { return layout_; }
  /// Set by the backend once the buffer holds the candidates.
  void set_layout(const ScoreBufferLayout& layout) { layout_ = layout; }

 private:
  friend class DeviceScoreStore;
  DeviceScoreBuffer(std::shared_ptr<DeviceScoreStore> store, float* data, size_t bytes)
      : store_(std::move(store)), data_(data), bytes_(bytes) {}

  std::shared_ptr<DeviceScoreStore> store_;
  float* data_;
  size_t bytes_;
  ScoreBufferLayout layout_;
};

/// The GPU backend's allocator of DeviceScoreBuffers on one device: a CUDA memory pool
/// (cudaMallocFromPoolAsync on the caller's stream, cudaFreeAsync on the store's own stream;
/// freed memory stays in the pool up to the cap, or 256 MiB without one, so sessions reuse it
/// without device-wide synchronisation), or plain cudaMalloc / cudaFree where the device has
/// no memory pools. Thread-safe.
class DeviceScoreStore : public std::enable_shared_from_this<DeviceScoreStore> {
 public:
  /// Creates the pool and the free stream on `device` (made current). `limit_bytes` caps the
  /// bytes of live buffers (0 = no cap but the device's memory). Errors: INTERNAL (CUDA).
  static absl::StatusOr<std::shared_ptr<DeviceScoreStore>> Create(int device, size_t limit_bytes);
  /// Waits for pending frees and destroys the pool (every buffer is gone by then).
  ~DeviceScoreStore();
  DeviceScoreStore(const DeviceScoreStore&) = delete;
  DeviceScoreStore& operator=(const DeviceScoreStore&) = delete;

  /// A buffer of `floats` fp32 values, allocated in stream order on `stream` (work queued on
  /// it afterwards may use it). Errors: RESOURCE_EXHAUSTED when the cap would be exceeded or
  /// the device is out of memory (the store stays usable); INTERNAL for other CUDA errors.
  absl::StatusOr<std::shared_ptr<DeviceScoreBuffer>> Allocate(size_t floats, cudaStream_t stream);

  /// Bytes of the live buffers.
  size_t bytes() const;
  size_t limit_bytes() const { return limit_bytes_; }
  int device() const { return device_; }

 private:
  DeviceScoreStore(int device, size_t limit_bytes) : device_(device), limit_bytes_(limit_bytes) {}
  friend class DeviceScoreBuffer;
  /// Frees a buffer's memory (called by ~DeviceScoreBuffer).
  void Release(float* data, size_t bytes);

  int device_;
  size_t limit_bytes_;
  cudaMemPool_t pool_ = nullptr;        // null: cudaMalloc / cudaFree
  cudaStream_t free_stream_ = nullptr;  // non-blocking; orders the pool's frees
  mutable std::mutex mutex_;
  size_t bytes_ = 0;  // guarded by mutex_
};

}  // namespace kvtrim::gpu
