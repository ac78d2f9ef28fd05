#include "kernels/bench/gpu_bench_timing.h"

#include <algorithm>

#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu::bench {

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::Status DeviceBuffer::Allocate(size_t bytes) {
  if (data_ != nullptr) {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaFree(data_), "cudaFree");
    data_ = nullptr;
  }
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMalloc(&data_, std::max<size_t>(bytes, 1)), "cudaMalloc");
  return absl::OkStatus();
}

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t e : {start_, after_score_, after_select_, end_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

absl::Status PhaseTimer::Init() {
  for (cudaEvent_t* e : {&start_, &after_score_, &after_select_, &end_}) {
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventCreate(e), "cudaEventCreate");
  }
  return absl::OkStatus();
}

absl::Status PhaseTimer::Time(cudaStream_t stream, PhaseTimes* times,
                              const std::function<absl::Status(const PipelineEvents&)>& enqueue) {
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream), "cudaEventRecord");
  PipelineEvents events;
  events.after_score = after_score_;
  events.after_select = after_select_;
  KVTRIM_RETURN_IF_ERROR(enqueue(events));
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventRecord(end_, stream), "cudaEventRecord");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end_), "cudaEventSynchronize");
  float score = 0, select = 0, total = 0;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&score, start_, after_score_), "elapsed");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&select, after_score_, after_select_),
                              "elapsed");
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&total, start_, end_), "elapsed");
  times->score_ms = score;
  times->select_ms = select;
  times->total_ms = total;
  return absl::OkStatus();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2) return values[mid];
  const double upper = values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return 0.5 * (lower + upper);
}

absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes, int reps, cudaStream_t stream) {
  DeviceBuffer src, dst;
  KVTRIM_RETURN_IF_ERROR(src.Allocate(bytes));
  KVTRIM_RETURN_IF_ERROR(dst.Allocate(bytes));
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.get(), 0x5A, bytes, stream), "cudaMemset");
  cudaEvent_t start = nullptr, end = nullptr;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  const cudaError_t made_end = cudaEventCreate(&end);
  if (made_end != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaStatus(made_end, "cudaEventCreate");
  }
  std::vector<double> ms;
  absl::Status status;
  for (int rep = 0; rep < reps + 2 && status.ok(); ++rep) {
    cudaError_t err = cudaEventRecord(start, stream);
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream);
    }
    if (err == cudaSuccess) err = cudaEventRecord(end, stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(end);
    float elapsed = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&elapsed, start, end);
    status = CudaStatus(err, "device-to-device copy");
    if (rep >= 2) ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  KVTRIM_RETURN_IF_ERROR(status);
  return 2.0 * static_cast<double>(bytes) / (Median(ms) * 1e6);
}

}  // namespace kvtrim::gpu::bench
