// Timing helpers of kvtrim_gpu_bench: RAII device buffers, CUDA-event phase timing of one
// layer's launches, medians, and the device-to-device copy bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gpu/runtime/device_pipeline.h"

namespace kvtrim::gpu::bench {

/// A cudaMalloc'ed buffer freed on destruction (nullptr until Allocate).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_) { other.data_ = nullptr; }

  /// Allocates `bytes` (frees a previous allocation first). Errors: CudaStatus().
  absl::Status Allocate(size_t bytes);
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

/// Milliseconds of the phases of one timed layer.
struct PhaseTimes {
  double score_ms = 0;   // start -> after_score
  double select_ms = 0;  // after_score -> after_select
  double total_ms = 0;   // start -> end
};

/// Four timing events reused across repetitions.
class PhaseTimer {
 public:
  PhaseTimer() = default;
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  /// Creates the events. Errors: CudaStatus().
  absl::Status Init();
  /// Records start, runs `enqueue` (which records the two phase events it is given), records
  /// end, waits for it and reads the three intervals.
  absl::Status Time(cudaStream_t stream, PhaseTimes* times,
                    const std::function<absl::Status(const PipelineEvents&)>& enqueue);

 private:
  cudaEvent_t start_ = nullptr, after_score_ = nullptr, after_select_ = nullptr, end_ = nullptr;
};

/// Median of `values` (0 when empty).
double Median(std::vector<double> values);

/// Device-to-device cudaMemcpyAsync of `bytes` on `stream`: 2 warm-ups, then `reps` timed
/// copies; returns the median (bytes read + bytes written) / time in GB/s (1e9 bytes).
absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes, int reps, cudaStream_t stream);

}  // namespace kvtrim::gpu::bench
