#include "kernels/gpu/runtime/device_pool.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu {

WorkerContext::WorkerContext(int device, const WorkerOptions& options)
    : device_(device),
      options_(options),
      arena_(options.arena_limit_bytes),
      graphs_(options.launch_graphs) {}

absl::StatusOr<std::unique_ptr<WorkerContext>> WorkerContext::Create(
    int device, const WorkerOptions& options) {
  if (options.staging_chunk_bytes == 0) {
    return absl::InvalidArgumentError("WorkerOptions.staging_chunk_bytes must be > 0");
  }
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  std::unique_ptr<WorkerContext> context(new WorkerContext(device, options));
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&context->stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&context->side_stream_, cudaStreamNonBlocking),
      "cudaStreamCreate(side)");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&context->fork_, cudaEventDisableTiming),
                              "cudaEventCreate(fork)");
  for (cudaEvent_t& event : context->chunk_free_) {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                "cudaEventCreate");
  }
  KVTRIM_RETURN_IF_ERROR(context->stage_events_.Create());
  return context;
}

WorkerContext::~WorkerContext() {
  // Destructors cannot report; every call is best effort on the way out.
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (side_stream_ != nullptr) cudaStreamSynchronize(side_stream_);
  for (cudaEvent_t event : chunk_free_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

namespace {

/// Staging copies of at least this many bytes are split over the context's copy threads:
/// one core copies pageable memory at 5-10 GB/s, below what the copy engine takes.
constexpr size_t kParallelStagingBytes = size_t{4} << 20;

}  // namespace

void WorkerContext::CopyToStaging(char* dst, const char* src, size_t bytes) {
  const auto parts = static_cast<size_t>(staging_copiers_.num_threads());
  if (bytes < kParallelStagingBytes || parts <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t part = (bytes + parts - 1) / parts;
  staging_copiers_.ParallelFor(static_cast<int64_t>(parts), [&](int64_t i) {
    const size_t begin = std::min(bytes, static_cast<size_t>(i) * part);
    std::memcpy(dst + begin, src + begin, std::min(part, bytes - begin));
  });
}

absl::Status WorkerContext::Upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const size_t chunk = options_.staging_chunk_bytes;
  if (staging_.capacity() < 2 * chunk) {
    // Growing frees the old chunks: wait for copies that may still read them.
    for (cudaEvent_t event : chunk_free_) {
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event), "cudaEventSynchronize(staging)");
    }
    KVTRIM_RETURN_IF_ERROR(staging_.Reserve(2 * chunk));
  }
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  for (size_t done = 0; done < bytes;) {
    const size_t len = std::min(chunk, bytes - done);
    const int slot = next_chunk_;
    next_chunk_ ^= 1;
    char* pinned = staging_.data() + static_cast<size_t>(slot) * chunk;
    // The previous copy out of this chunk must have finished before it is overwritten.
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(chunk_free_[slot]),
                                "cudaEventSynchronize(staging)");
    CopyToStaging(pinned, in + done, len);
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out + done, pinned, len, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(host to device)");
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(chunk_free_[slot], stream_), "cudaEventRecord");
    done += len;
  }
  return absl::OkStatus();
}

absl::Status WorkerContext::ForkSide() {
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream_), "cudaEventRecord(fork)");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_stream_, fork_, 0),
                              "cudaStreamWaitEvent(fork)");
  return absl::OkStatus();
}

absl::Status WorkerContext::Synchronize() {
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(side_stream_),
                              "cudaStreamSynchronize(side)");
  return absl::OkStatus();
}

void WorkerContext::Quiesce() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);  // a sticky error is re-reported by the next request
  cudaStreamSynchronize(side_stream_);
  cudaGetLastError();
}

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(int device, int workers,
                                                               const WorkerOptions& options) {
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DevicePool needs at least one worker, got ", workers));
  }
  std::unique_ptr<DevicePool> pool(new DevicePool());
  for (int i = 0; i < workers; ++i) {
    auto context = WorkerContext::Create(device, options);
    if (!context.ok()) return context.status();
    pool->free_.push_back(context->get());
    pool->contexts_.push_back(*std::move(context));
  }
  return pool;
}

DevicePool::Lease DevicePool::Acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  available_.wait(lock, [this] { return !free_.empty(); });
  WorkerContext* context = free_.back();
  free_.pop_back();
  return Lease(*this, context);
}

void DevicePool::Release(WorkerContext* context) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(context);
  }
  available_.notify_one();
}

DevicePool::Lease::~Lease() {
  if (context_ == nullptr) return;
  context_->Quiesce();
  pool_->Release(context_);
}

LaunchGraphStats DevicePool::GraphStats() const {
  LaunchGraphStats total;
  for (const auto& context : contexts_) {
    const LaunchGraphStats stats = context->graphs().stats();
    total.direct += stats.direct;
    total.captured += stats.captured;
    total.replayed += stats.replayed;
    total.fallbacks += stats.fallbacks;
  }
  return total;
}

}  // namespace kvtrim::gpu
