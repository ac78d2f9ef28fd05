// Command-line options of kvtrim_gpu_bench (gpu_policies_bench.cc documents each flag).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/policy_kind.h"

namespace kvtrim::gpu::bench {

/// Every flag of kvtrim_gpu_bench, with its default.
struct Options {
  std::string out_dir = "out";
  int reps = 25;
  int warmup = 3;
  std::vector<int64_t> ns = {4096, 32768, 131072};
  std::vector<int64_t> windows = {8, 32};
  std::vector<std::string> policies;  // empty = every preset
  int64_t copy_mib = 1024;
  double keep_fraction = 0.1;
  std::vector<int64_t> model_ns = {32768, 131072};  // model-aware presets (w = 32)
  int64_t model_w = 32;
  int64_t hidden = 4096;
  int host_reps = 3;  // host-only rows (DecideLaProx over 32 layers, EA statistics)
  /// Numerics modes measured for every configuration, in this order, on the same inputs.
  std::vector<Numerics> numerics = {Numerics::kFast, Numerics::kExact};
  /// Input dtypes measured at every n.
  std::vector<DType> dtypes = {DType::kBF16};
  /// Further dtypes measured only at the n of extra_dtypes_n (issue 12: f16 and f32 at 32K).
  std::vector<DType> extra_dtypes = {DType::kF16, DType::kF32};
  std::vector<int64_t> extra_dtypes_n = {32768};
  /// Per-launch CUDA events in stage_reps extra repetitions after the timed ones.
  bool stages = false;
  int stage_reps = 5;
  /// Launch graphs (GpuBackendOptions::launch_graphs = 64: a layer seen before is replayed as
  /// one graph). Off by default, as kvtrimd runs.
  bool graphs = false;
  /// With graphs on: every fast row run by EnqueueLayer also timed with launches issued one by
  /// one (Row::direct_us), in the same run.
  bool compare_direct = true;
};

/// Parses argv into `options`; returns false (after printing why to stderr) on a bad flag.
bool ParseOptions(int argc, char** argv, Options* options);

/// The dtypes measured at n: options.dtypes, then the extra dtypes when n is one of
/// extra_dtypes_n (each dtype once, in that order).
std::vector<DType> DTypesAt(const Options& options, int64_t n);

}  // namespace kvtrim::gpu::bench
