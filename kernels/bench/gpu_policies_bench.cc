// kvtrim_gpu_bench: every preset's scorer + selection on the GPU, timed with CUDA events on
// device-resident inputs, beside the device-to-device copy bandwidth of the same run.
//
// Shape (issues "Benchmarks" and 12): H_kv = 8, G = 4 (H_q = 32), d = 128, batch 1,
// n in {4096, 32768, 131072}, w in {8, 32} query rows; keep_fraction 0.1; layer 16 of 32
// (PyramidKV). Window parameters above w are lowered to w (SnapKV's 32 at w = 8).
// Dtypes: --dtypes at every n (default bf16), plus --extra_dtypes (default f16, f32) at the n
// of --extra_dtypes_n (default 32768). Numerics: every configuration is measured once per
// mode of --numerics (default fast, then exact) on the same inputs: the bench sets
// settings.numerics on the resolved policy before PlanLayer, which reads it.
// Per configuration and mode: warm-up, then >= 20 timed repetitions rotating over enough
// input sets to exceed 4x the L2 cache (at least 2), median of each phase:
//   score  = LaunchScore + NaN probe + protection (with the fused per-head selection the probe
//            and protection run inside the selection launch and count as select),
//   select = AdaKV counts (adakv) + per-head top-k           (JSON: selection_us),
//   total  = score + select (the perturbation statistic is off: it is not part of a policy)
//                                                           (JSON: kvtrim_us = total_us).
// scorer_bytes = K, V (only when the scorer reads V) and Q, each read once (StreamingLLM and
// Random read none); GB/s = bytes / time; copy fraction = GB/s / copy GB/s.
// scratch = device bytes of one layer request beyond its inputs (scores, counts, offsets,
// indices, launcher scratch), as GpuBackend's arena holds them.
// copy GB/s = (bytes read + bytes written) / time of a cudaMemcpy device-to-device.
// --stages: after the timed repetitions, --stage_reps (default 5) more record a CUDA event
// after every kernel launch, memset and async copy of the layer sequence (gpu_bench_stages.h);
// each row then lists every launch with its kernel name and median microseconds.
// Launch graphs (--graphs, default off, as kvtrimd runs): a layer whose launch sequence was
// seen before is replayed as one CUDA graph (kernels/gpu/runtime/launch_graph.h); the warm-up
// covers the first two sights of every input set, and the row counts the replays. With
// --compare_direct (default on) every fast row of EnqueueLayer is timed again in the same run with
// the launches issued one by one: direct_us, the reference of the graphs' gain. The answer is
// checked three times (issued, captured, replayed) and must not change.
// numerics_planned: LayerPlan::numerics, the mode the plan computes (a policy without a fast
// path computes exact); detected at compile time, null if the field is absent.
//
// Model-aware presets (criticalkv, criticalkv_adakv, laprox, expected_attention, lukv) run at
// the issue-3 shapes only: w = 32, n in --model_n (default 32768, 131072; the extra dtypes at
// the n of --extra_dtypes_n among them), hidden D = 4096, on random device-resident model
// tensors (W_O / Gram matrices lane-major fp32, EA statistics in the arena) and a host model
// stub carrying a random snapkv LU-KV profile. Host-decided presets (criticalkv*, lukv) time
// the device scoring with events and the host part (scores copied back, then
// kernels/decide/decide.h DecideLayer) with the host clock: select = copy + decide. laprox
// times the per-layer score kernel; the row "laprox_decide32" times the host DecideLaProx
// (mode model) over 32 layers of [8, n] scores, and "ea_stats_host" the host
// ComputeExpectedQueryStats of one layer (query_stats model); these two rows have no
// numerics (null).
//
// Usage: kvtrim_gpu_bench [--out=DIR] [--reps=25] [--warmup=3] [--n=4096,32768,131072]
//                         [--w=8,32] [--policies=a,b] [--copy_mib=1024]
//                         [--model_n=32768,131072] [--hidden=4096] [--host_reps=3]
//                         [--numerics=fast,exact] [--dtypes=bf16] [--extra_dtypes=f16,f32]
//                         [--extra_dtypes_n=32768] [--stages] [--stage_reps=5]
//                         [--graphs=0] [--compare_direct=1]
// Writes DIR/gpu_bench.json and DIR/gpu_bench.csv (DIR default "out"), rewritten after every
// row ("complete": true once all ran); prints a table.
// Exit status: 0 when every configuration ran and its answer is well formed (offsets, and
// lists strictly ascending in [0, n)), 1 otherwise, 2 for a bad flag.
#include <cuda_runtime.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/bench/gpu_bench_config.h"
#include "kernels/bench/gpu_bench_model.h"
#include "kernels/bench/gpu_bench_options.h"
#include "kernels/bench/gpu_bench_row.h"
#include "kernels/bench/gpu_bench_stages.h"
#include "kernels/bench/gpu_bench_timing.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/device_probe.h"
#include "kernels/registry.h"

namespace kvtrim::gpu::bench {
namespace {

/// Prints the table header.
void PrintHeader() {
  std::printf("%-16s %7s %3s %-4s %-5s %10s %10s %10s %10s %9s %6s %6s %10s %s\n", "policy", "n",
              "w", "type", "mode", "score_us", "select_us", "total_us", "direct_us", "GB/s",
              "%copy", "%sel", "scratch_MB", "note");
}

/// Prints one row of the table (its error, else its note, when it has one).
void PrintRow(const Row& r, double copy_gbps) {
  const std::string note = !r.error.empty() ? r.error
                           : !r.note.empty() ? r.note
                           : r.bytes         ? ""
                                             : "reads no tensor";
  std::printf("%-16s %7lld %3lld %-4s %-5s %10.1f %10.1f %10.1f %10.1f %9.1f %6.1f %6.1f %10.2f "
              "%s\n",
              r.policy.c_str(), static_cast<long long>(r.n), static_cast<long long>(r.w),
              DTypeName(r.dtype), r.numerics ? NumericsName(*r.numerics) : "-", r.score_us,
              r.select_us, r.total_us, r.direct_us, r.score_gbps,
              copy_gbps > 0 ? 100.0 * r.score_gbps / copy_gbps : 0.0,
              r.total_us > 0 ? 100.0 * r.select_us / r.total_us : 0.0, r.scratch_bytes / 1e6,
              note.c_str());
  for (size_t i = 0; i < r.stages.size(); ++i) {
    std::printf("    stage %2zu %-7s %9.1f us  %s\n", i, r.stages[i].kind.c_str(), r.stages[i].us,
                r.stages[i].name.c_str());
  }
  std::fflush(stdout);
}

/// Runs the whole benchmark; the exit status of the program.
int Main(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, &options)) return 2;
  const DeviceCensus census = CountCudaDevices();
  if (census.count == 0) {
    std::cerr << "kvtrim_gpu_bench: no CUDA device (" << census.reason << ")\n";
    return 1;
  }
  cudaDeviceProp prop{};
  if (auto st = CudaStatus(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      !st.ok()) {
    std::cerr << "kvtrim_gpu_bench: " << st << "\n";
    return 1;
  }
  cudaStream_t stream = nullptr;
  if (auto st = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                           "cudaStreamCreate");
      !st.ok()) {
    std::cerr << "kvtrim_gpu_bench: " << st << "\n";
    return 1;
  }
  RunInfo info;
  info.device = DescribeCudaDevice(0);
  info.copy_mib = options.copy_mib;
  info.reps = options.reps;
  info.warmup = options.warmup;
  info.keep_fraction = options.keep_fraction;
  info.stages = options.stages;
  info.stage_reps = options.stages ? options.stage_reps : 0;
  std::printf("kvtrim_gpu_bench on %s, L2 %.0f MB\n", info.device.c_str(),
              prop.l2CacheSize / 1e6);

  auto copy = MeasureCopyBandwidth(static_cast<size_t>(options.copy_mib) << 20, options.reps,
                                   stream);
  if (!copy.ok()) {
    std::cerr << "kvtrim_gpu_bench: copy bandwidth: " << copy.status() << "\n";
    return 1;
  }
  info.copy_gbps = *copy;
  std::printf("device-to-device copy: %.1f GB/s (read + write of %lld MiB, median of %d)\n\n",
              *copy, static_cast<long long>(options.copy_mib), options.reps);

  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  BenchModel model;
  MakeBenchModel(options, &model);
  auto runtime = BenchRuntime::Create(0);
  if (runtime.ok()) (*runtime)->context().graphs().set_capacity(options.graphs ? 64 : 0);
  if (!runtime.ok()) {
    std::cerr << "kvtrim_gpu_bench: worker context: " << runtime.status() << "\n";
    return 1;
  }
  GpuBackendOptions backend_options;
  auto backend = GpuBackend::Create(
      backend_options,
      std::make_unique<CpuBackend>(GpuBackend::HostFallbackThreads(backend_options)));
  if (!backend.ok()) {
    std::cerr << "kvtrim_gpu_bench: backend: " << backend.status() << "\n";
    return 1;
  }
  LaunchRecorder recorder;
  if (options.stages) {
    if (auto st = recorder.Init(); !st.ok()) {
      std::cerr << "kvtrim_gpu_bench: stage events: " << st << "\n";
      return 1;
    }
  }
  std::vector<std::string> presets = options.policies;
  if (presets.empty()) {
    for (const auto& p : registry.presets()) presets.push_back(p.name);
  }
  PrintHeader();
  std::vector<Row> rows;
  bool all_ok = true;
  bool written = true;
  auto keep = [&](Row r) {
    all_ok = all_ok && r.error.empty();
    PrintRow(r, info.copy_gbps);
    rows.push_back(std::move(r));
    written = WriteResults(options.out_dir, info, rows) && written;
  };
  bool any_model = false;
  for (const std::string& preset : presets) {
    const bool needs_model = PresetNeedsModel(registry, preset);
    any_model = any_model || needs_model;
    const std::vector<int64_t>& ns = needs_model ? options.model_ns : options.ns;
    const std::vector<int64_t> windows =
        needs_model ? std::vector<int64_t>{options.model_w} : options.windows;
    for (int64_t n : ns) {
      for (int64_t w : windows) {
        for (DType dtype : DTypesAt(options, n)) {
          for (Row& r : RunConfig(registry, preset, n, w, dtype, options, **runtime,
                                  static_cast<size_t>(prop.l2CacheSize), model,
                                  options.stages ? &recorder : nullptr)) {
            keep(std::move(r));
          }
        }
      }
    }
  }
  if (any_model) {
    for (int64_t n : options.model_ns) {
      for (Row& r : RunHostRows(registry, model, n, options, **backend)) keep(std::move(r));
    }
  }
  info.complete = true;
  written = WriteResults(options.out_dir, info, rows) && written;
  std::printf("\n%s %s/gpu_bench.json and %s/gpu_bench.csv\n",
              written ? "wrote" : "FAILED to write", options.out_dir.c_str(),
              options.out_dir.c_str());
  cudaStreamDestroy(stream);
  return all_ok && written ? 0 : 1;
}

}  // namespace
}  // namespace kvtrim::gpu::bench

int main(int argc, char** argv) { return kvtrim::gpu::bench::Main(argc, argv); }
