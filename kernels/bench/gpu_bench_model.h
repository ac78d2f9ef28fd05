// The model of kvtrim_gpu_bench's model-aware presets (criticalkv, criticalkv_adakv, laprox,
// expected_attention, lukv) and the model-wide rows (the LaProx decision over 32 layers on the
// device and on the host, the EA query statistics of one layer).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bench/gpu_bench_options.h"
#include "kernels/bench/gpu_bench_row.h"
#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/model.h"
#include "kernels/registry.h"

namespace kvtrim::gpu::bench {

/// A registered-model stand-in: the layout, random host tensors of layer kLayerId only (their
/// values only set the arithmetic's magnitudes: the Gram matrices are random, not W_O Wᵀ),
/// random query statistics of every layer and a random snapkv LU-KV profile.
struct BenchModel {
  std::shared_ptr<RegisteredModel> host;
};

/// Fills `model` (hidden width options.hidden): random host tensors of layer kLayerId (W_O, Gram
/// matrices, query statistics) and a snapkv LU-KV profile; the runtime's DeviceModelCache
/// uploads what a plan reads, as for a registered model.
void MakeBenchModel(const Options& options, BenchModel* model);

/// Rows of the model-wide steps at n, median of options.host_reps (host clock):
/// laprox_decide32 = GpuBackend::DecideModelWide over kNumLayers layers of random scores kept on
/// the device (the indices come back, the decisions are built on the host);
/// laprox_decide32_host = the same decision by DecideLaProx on the host (both timed from the
/// call to its answer; the answers are checked after the clock stops); ea_stats_host =
/// ComputeExpectedQueryStats of one layer.
std::vector<Row> RunHostRows(const PolicyRegistry& registry, const BenchModel& model, int64_t n,
                             const Options& options, GpuBackend& backend);

}  // namespace kvtrim::gpu::bench
