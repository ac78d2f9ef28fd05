// Per-launch stage timing of kvtrim_gpu_bench (--stages), without touching kernels/gpu/:
// while a LaunchRecorder is armed, every kernel launch, cudaMemsetAsync and cudaMemcpyAsync
// that the layer sequence issues records one CUDA event on its stream right after it. The
// hooks are the bench executable's own definitions of the CUDA runtime entry points that the
// nvcc-generated launch stubs and the pipeline call (__cudaLaunchKernel, cudaLaunchKernelExC
// for cluster launches, cudaMemsetAsync, cudaMemcpyAsync); each forwards to libcudart's (dlsym RTLD_NEXT) and, only while armed,
// records the event. The interval between consecutive events is the time of that launch
// (launches on one stream run one after the other), event overhead included.
// The clean alternative, a per-launch hook in kernels/gpu PipelineEvents, is described in
// docs/gpu.md ("Benchmarks").
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvtrim::gpu::bench {

/// One recorded launch: its kind ("kernel", "memset", "memcpy"), the kernel's name (demangled,
/// without parameters; "" for memsets and copies) and its median duration.
struct StageTime {
  std::string kind;
  std::string name;
  double us = 0;
};

/// Records an event after every launch while armed (one recorder armed at a time).
class LaunchRecorder {
 public:
  LaunchRecorder() = default;
  ~LaunchRecorder();
  LaunchRecorder(const LaunchRecorder&) = delete;
  LaunchRecorder& operator=(const LaunchRecorder&) = delete;

  /// Creates the pool of `max_launches` + 1 events. Errors: CudaStatus().
  absl::Status Init(int max_launches = 256);
  /// Records the start event on `stream` and arms the hooks.
  absl::Status Begin(cudaStream_t stream);
  /// Disarms, waits for the last event and appends this repetition's per-launch
  /// milliseconds to the recorder's history (launches beyond the pool are not timed).
  absl::Status End();
  /// The per-launch medians over every repetition whose launch sequence matched the first
  /// one's; clears the history.
  std::vector<StageTime> TakeMedians();

  /// Called by the hooks after a successful launch on `stream`: records the next event.
  /// `kernel` is the launched kernel (nullptr for memsets and copies): a cudaKernel_t handle,
  /// or with `entry` the host entry function of a cudaLaunchKernelEx launch.
  void AfterLaunch(cudaStream_t stream, const char* kind, const void* kernel, bool entry = false);

 private:
  struct Launch {
    const char* kind;
    const void* kernel;
    bool entry;  // kernel is a host entry function, not a cudaKernel_t
  };
  std::vector<cudaEvent_t> events_;
  std::vector<Launch> launches_;                 // this repetition's launches
  std::vector<std::vector<Launch>> sequences_;   // launches of every repetition
  std::vector<std::vector<double>> ms_;          // per repetition, per launch
  bool truncated_ = false;
};

}  // namespace kvtrim::gpu::bench
