#include "libkvtrim/ready_events.h"

#include "absl/strings/str_cat.h"

#if KVTRIM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvtrim::inprocess {

ReadyEvent::~ReadyEvent() {
  if (event_ != nullptr && pool_ != nullptr) pool_->Release(event_);
}

ReadyEvent& ReadyEvent::operator=(ReadyEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr && pool_ != nullptr) pool_->Release(event_);
    pool_ = other.pool_;
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

ReadyEventPool::~ReadyEventPool() {
#if KVTRIM_HAVE_CUDA
  for (void* event : free_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
#endif
}

void ReadyEventPool::Release(void* event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

absl::StatusOr<ReadyEvent> ReadyEventPool::Record(void* stream) {
#if KVTRIM_HAVE_CUDA
  int previous = 0;
  cudaGetDevice(&previous);
  if (previous != device_) cudaSetDevice(device_);
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      event = static_cast<cudaEvent_t>(free_.back());
      free_.pop_back();
    }
  }
  cudaError_t error = cudaSuccess;
  if (event == nullptr) error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (error == cudaSuccess) error = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
  if (previous != device_) cudaSetDevice(previous);
  if (error != cudaSuccess) {
    if (event != nullptr) cudaEventDestroy(event);
    return absl::InternalError(absl::StrCat("cuda_stream: recording the ready event failed: ",
                                            cudaGetErrorString(error)));
  }
  return ReadyEvent(this, event);
#else
  (void)stream;
  return ReadyEvent();
#endif
}

}  // namespace kvtrim::inprocess
