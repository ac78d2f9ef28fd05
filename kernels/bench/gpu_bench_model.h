// The model of kvtrim_gpu_bench's model-aware presets (criticalkv, criticalkv_adakv, laprox,
// expected_attention, lukv) and the host-only rows (DecideLaProx over 32 layers, the EA query
// statistics of one layer).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench/gpu_bench_options.h"
#include "kernels/bench/gpu_bench_row.h"
#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/model.h"
#include "kernels/registry.h"

namespace kvtrim::gpu::bench {

/// Random lane-major device tensors of one layer (their values only set the arithmetic's
/// magnitudes) and a host stub with the layout, random query statistics and a random snapkv
/// LU-KV profile (sink 0, window options.model_w).
struct BenchModel {
  std::shared_ptr<RegisteredModel> host;
  DeviceBuffer w_o, head_gram, group_gram;
  DeviceBuffer w_o16;  // the fast CriticalKV image of w_o (LaunchBuildFastWo)
};

/// Fills `model` (hidden width options.hidden) on `stream` and waits for it.
/// Errors: CudaStatus() of an allocation or fill.
absl::Status MakeBenchModel(const Options& options, cudaStream_t stream, BenchModel* model);

/// Host-only rows at n: DecideLaProx (mode model) over kNumLayers layers of random scores,
/// and ComputeExpectedQueryStats of one layer; median of options.host_reps (host clock).
std::vector<Row> RunHostRows(const PolicyRegistry& registry, const BenchModel& model, int64_t n,
                             const Options& options);

}  // namespace kvtrim::gpu::bench
