// The CUDA events that split one layer's device time into stages on a worker's stream
// (LayerProfile's device fields), and the capture-aware event record the pipeline uses.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/layer.h"

namespace kvtrim::gpu {

/// Records `event` on `stream` unless it is null. Inside a stream capture (launch_graph.h)
/// the record is external, so that it becomes an event record node and a replayed graph still
/// records it. Errors: CudaStatus().
absl::Status RecordStreamEvent(cudaEvent_t event, cudaStream_t stream);

/// Seven timing events of one worker context, recorded at the boundaries of a layer's device
/// stages when the request asks for a profile (CompressionSettings::profile):
///   kBegin -> kWaited      the stream waiting on the client's ready event (CUDA IPC)
///   kWaited -> kStaged     uploads and gathers of the inputs (the probes run on the side
///                          stream)
///   kStaged -> kScored     the scorer
///   kScored -> kSelected   allocation and selection
///   kSelected -> kLaunched the perturbation statistic
///   kLaunched -> kCopied   the answer's copy to pinned host memory
/// Used by one layer at a time, like its WorkerContext.
class StageEvents {
 public:
  enum Mark { kBegin, kWaited, kStaged, kScored, kSelected, kLaunched, kCopied, kNumMarks };

  StageEvents() = default;
  ~StageEvents();
  StageEvents(const StageEvents&) = delete;
  StageEvents& operator=(const StageEvents&) = delete;

  /// Creates the events on the current device. Errors: CudaStatus().
  absl::Status Create();
  /// The event of `mark` (null before Create).
  cudaEvent_t event(Mark mark) const { return events_[mark]; }
  /// Forgets the marks of the previous layer.
  void Reset();
  /// Records `mark` on `stream` (RecordStreamEvent). Errors: CudaStatus().
  absl::Status Record(Mark mark, cudaStream_t stream);
  /// Notes that `mark` was recorded by someone else (an event handed to the pipeline).
  void MarkRecorded(Mark mark) { recorded_[mark] = true; }
  /// After the stream has synchronised: the interval between each pair of consecutive marks
  /// that were both recorded, in seconds, into `profile`'s device fields (0 otherwise).
  /// Errors: CudaStatus().
  absl::Status Read(LayerProfile* profile) const;

 private:
  /// Seconds from mark `from` to mark `to`, 0 unless both were recorded.
  absl::Status Seconds(Mark from, Mark to, double* out) const;

  cudaEvent_t events_[kNumMarks] = {};
  bool recorded_[kNumMarks] = {};
};

}  // namespace kvtrim::gpu
