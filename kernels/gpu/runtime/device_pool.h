// The GPU backend's device memory pool: N worker contexts, each with its own stream,
// device arena and pinned staging buffers, checked out by one request at a time.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "kernels/thread_pool.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/runtime/launch_graph.h"
#include "kernels/gpu/runtime/stage_events.h"

namespace kvtrim::gpu {

/// Sizes of one worker context's memory.
struct WorkerOptions {
  /// Cap of the worker's device arena in bytes (0 = no cap but the device's free memory).
  size_t arena_limit_bytes = 0;
  /// Bytes of each of the two pinned chunks that stage host-to-device copies.
  size_t staging_chunk_bytes = size_t{8} << 20;
  /// Launch sequences kept as CUDA graphs for replay (launch_graph.h); 0 = no graphs.
  size_t launch_graphs = 0;
};

/// Everything one in-flight layer request uses on the device: a non-blocking stream, a
/// device arena, two pinned staging chunks (double-buffered uploads) and a pinned download
/// buffer. Used by one thread at a time (DevicePool hands it out).
class WorkerContext {
 public:
  /// Creates the stream and events on `device` (the calling thread's current device is
  /// set to it). Memory is allocated lazily, on first use. Errors: INTERNAL.
  static absl::StatusOr<std::unique_ptr<WorkerContext>> Create(int device,
                                                               const WorkerOptions& options);
  /// Waits for the stream, then releases the stream, events and memory.
  ~WorkerContext();
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  /// The worker's stream (every launch of its requests goes here).
  cudaStream_t stream() const { return stream_; }
  /// A second stream for work that overlaps the main one and that nothing on it waits for
  /// (the inputs' NaN / Inf probes); Synchronize() and Quiesce() wait for it too.
  cudaStream_t side_stream() const { return side_stream_; }
  /// Makes the side stream wait for everything enqueued on the main stream so far.
  absl::Status ForkSide();
  /// The worker's device arena.
  DeviceArena& arena() { return arena_; }
  /// Pinned host buffer for small uploads and for downloads of the results.
  PinnedBuffer& transfer() { return transfer_; }
  /// The device ordinal the context lives on.
  int device() const { return device_; }
  /// Launch sequences replayed as CUDA graphs on the worker's stream.
  LaunchGraphCache& graphs() { return graphs_; }
  const LaunchGraphCache& graphs() const { return graphs_; }
  /// The timing events of a profiled layer's device stages (stage_events.h).
  StageEvents& stage_events() { return stage_events_; }

  /// Copies `bytes` from pageable host memory `src` to device memory `dst`, asynchronously
  /// on the stream, through the two pinned staging chunks: chunk i is filled by memcpy (by
  /// the context's kStagingCopyThreads for chunks of 4 MiB and more) while chunk i-1 is in
  /// flight. Returns when `src` has been read in full (it may be released); the copies
  /// themselves complete in stream order. Errors: CudaStatus().
  absl::Status Upload(void* dst, const void* src, size_t bytes);

  /// Blocks until all work queued on the stream (and the side stream) has finished.
  /// Errors: CudaStatus().
  absl::Status Synchronize();

  /// Makes the context safe for the next request after a failure: waits for the stream
  /// (ignoring its error) and clears the calling thread's last non-sticky CUDA error.
  void Quiesce();

 private:
  WorkerContext(int device, const WorkerOptions& options);
  /// std::memcpy of `bytes` into the pinned staging `dst`, split over staging_copiers_
  /// when large.
  void CopyToStaging(char* dst, const char* src, size_t bytes);

  int device_;
  WorkerOptions options_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr;                       // ForkSide: main -> side
  cudaEvent_t chunk_free_[2] = {nullptr, nullptr};  // recorded after each chunk's copy
  int next_chunk_ = 0;
  DeviceArena arena_;
  PinnedBuffer staging_;   // [2 x staging_chunk_bytes]
  /// Threads (the caller included) that fill a staging chunk together.
  static constexpr int kStagingCopyThreads = 4;
  ThreadPool staging_copiers_{kStagingCopyThreads};
  PinnedBuffer transfer_;
  LaunchGraphCache graphs_;  // the stream's replayable launch sequences
  StageEvents stage_events_;  // destroyed after ~WorkerContext synchronised the stream
};

/// N worker contexts handed out one request at a time. Acquire() blocks while all N are
/// in use; the Lease gives its context back (quiesced) when it goes out of scope.
class DevicePool {
 public:
  /// Creates `workers` (>= 1) contexts on `device`. Errors: INVALID_ARGUMENT for
  /// workers < 1, the CUDA errors of WorkerContext::Create.
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(int device, int workers,
                                                            const WorkerOptions& options);

  /// Exclusive use of one worker context until destruction (RAII).
  class Lease {
   public:
    Lease(DevicePool& pool, WorkerContext* context) : pool_(&pool), context_(context) {}
    /// Quiesces the context and gives it back to the pool.
    ~Lease();
    Lease(Lease&& other) noexcept : pool_(other.pool_), context_(other.context_) {
      other.context_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;

    WorkerContext* operator->() const { return context_; }
    WorkerContext& operator*() const { return *context_; }

   private:
    DevicePool* pool_;
    WorkerContext* context_;
  };

  /// Checks a context out, waiting until one is free.
  Lease Acquire();
  /// Number of worker contexts.
  int size() const { return static_cast<int>(contexts_.size()); }
  /// The launch graphs' counts summed over every worker context.
  LaunchGraphStats GraphStats() const;

 private:
  DevicePool() = default;
  void Release(WorkerContext* context);

  std::vector<std::unique_ptr<WorkerContext>> contexts_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<WorkerContext*> free_;  // guarded by mutex_
};

}  // namespace kvtrim::gpu
