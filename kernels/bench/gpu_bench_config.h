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
#include "kernels/registry.h"

namespace kvtrim::gpu::bench {

/// Measures `preset` at (n, w, dtype): fills enough input sets to exceed 4x the L2 cache
/// (`l2_bytes`), then for each mode of options.numerics sets settings.numerics on the resolved
/// policy, plans the layer and times options.reps repetitions after options.warmup (and, with
/// options.stages, options.stage_reps more through `recorder`). One row per mode, in order;
/// a configuration that cannot be planned or run yields rows with `error` set.
std::vector<Row> RunConfig(const PolicyRegistry& registry, const std::string& preset, int64_t n,
                           int64_t w, DType dtype, const Options& options, cudaStream_t stream,
                           size_t l2_bytes, const BenchModel& model, LaunchRecorder* recorder);

/// True when `preset` reads a registered model (it then runs at options.model_ns and
/// options.model_w only).
bool PresetNeedsModel(const PolicyRegistry& registry, const std::string& preset);

}  // namespace kvtrim::gpu::bench
