#include "kernels/gpu/runtime/stage_events.h"

#include <algorithm>

#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu {

absl::Status RecordStreamEvent(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return absl::OkStatus();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  // The external flag is refused outside a capture.
  const unsigned flags =
      capture == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecordWithFlags(event, stream, flags), "cudaEventRecord");
  return absl::OkStatus();
}

StageEvents::~StageEvents() {
  for (cudaEvent_t event : events_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
}

absl::Status StageEvents::Create() {
  for (cudaEvent_t& event : events_) {
    if (event == nullptr) {
      KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event), "cudaEventCreate(stage)");
    }
  }
  return absl::OkStatus();
}

void StageEvents::Reset() { std::fill(std::begin(recorded_), std::end(recorded_), false); }

absl::Status StageEvents::Record(Mark mark, cudaStream_t stream) {
  KVTRIM_RETURN_IF_ERROR(RecordStreamEvent(events_[mark], stream));
  recorded_[mark] = events_[mark] != nullptr;
  return absl::OkStatus();
}

absl::Status StageEvents::Seconds(Mark from, Mark to, double* out) const {
  *out = 0;
  if (!recorded_[from] || !recorded_[to]) return absl::OkStatus();
  float ms = 0;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[from], events_[to]),
                              "cudaEventElapsedTime(stage)");
  *out = std::max(0.0, static_cast<double>(ms) * 1e-3);
  return absl::OkStatus();
}

absl::Status StageEvents::Read(LayerProfile* profile) const {
  KVTRIM_RETURN_IF_ERROR(Seconds(kBegin, kWaited, &profile->ready_wait));
  KVTRIM_RETURN_IF_ERROR(Seconds(kWaited, kStaged, &profile->stage_device));
  KVTRIM_RETURN_IF_ERROR(Seconds(kStaged, kScored, &profile->score));
  KVTRIM_RETURN_IF_ERROR(Seconds(kScored, kSelected, &profile->select));
  KVTRIM_RETURN_IF_ERROR(Seconds(kSelected, kLaunched, &profile->perturbation));
  KVTRIM_RETURN_IF_ERROR(Seconds(kLaunched, kCopied, &profile->download));
  return absl::OkStatus();
}

}  // namespace kvtrim::gpu
