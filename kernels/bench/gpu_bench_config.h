// One kvtrim_gpu_bench configuration: a preset at (n, w, dtype), measured once per numerics
// mode on the same device-resident inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/bench/gpu_bench_model.h"
#include "kernels/bench/gpu_bench_options.h"
#include "kernels/bench/gpu_bench_row.h"
#include "kernels/bench/gpu_bench_stages.h"
#include "kernels/gpu/runtime/device_model_cache.h"
#include "kernels/gpu/runtime/device_pool.h"
#include "kernels/gpu/runtime/device_score_buffer.h"
#include "kernels/registry.h"

namespace kvtrim::gpu::bench {

/// The GPU runtime the benchmark drives (layer_run.h), as one GpuBackend worker holds it: a
/// worker context (stream, arena, pinned buffers) and the device cache of the bench model's
/// tensors.
class BenchRuntime {
 public:
  /// One worker context on `device` with no arena cap. Errors: WorkerContext::Create's.
  static absl::StatusOr<std::unique_ptr<BenchRuntime>> Create(int device);
  WorkerContext& context() { return *context_; }
  DeviceModelCache& cache() { return cache_; }
  /// Resident score buffers are not benchmarked per layer (see RunHostRows): none.
  DeviceScoreStore* store() { return nullptr; }

 private:
  explicit BenchRuntime(int device) : cache_(device, 0) {}
  std::unique_ptr<WorkerContext> context_;
  DeviceModelCache cache_;
};

/// Measures `preset` at (n, w, dtype): fills enough device-resident input sets to exceed 4x the
/// L2 cache (`l2_bytes`), then for each mode of options.numerics sets settings.numerics (and
/// turns the perturbation statistic off) on the resolved policy and times the runtime's
/// LayerRun::Enqueue: options.reps repetitions after options.warmup (and, with options.stages,
/// options.stage_reps more through `recorder`). One row per mode, in order; a configuration
/// that cannot be planned or run yields rows with `error` set.
std::vector<Row> RunConfig(const PolicyRegistry& registry, const std::string& preset, int64_t n,
                           int64_t w, DType dtype, const Options& options, BenchRuntime& runtime,
                           size_t l2_bytes, const BenchModel& model, LaunchRecorder* recorder);

/// True when `preset` reads a registered model (it then runs at options.model_ns and
/// options.model_w only).
bool PresetNeedsModel(const PolicyRegistry& registry, const std::string& preset);

}  // namespace kvtrim::gpu::bench
