// Rows of kvtrim_gpu_bench: one measured (policy, n, w, dtype, numerics) configuration, the
// check of an answer's shape, and the JSON / CSV files written from them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/bench/gpu_bench_stages.h"
#include "base/dtype.h"
#include "kernels/policy_kind.h"
#include "nlohmann/json.hpp"

namespace kvtrim::gpu::bench {

constexpr int64_t kKvHeads = 8;
constexpr int64_t kGroup = 4;
constexpr int64_t kHeadDim = 128;
constexpr int32_t kLayerId = 16;
constexpr int32_t kNumLayers = 32;

/// One measured configuration.
struct Row {
  std::string policy, scorer;
  int64_t n = 0, w = 0;
  DType dtype = DType::kBF16;
  std::optional<Numerics> numerics;  // requested (settings.numerics); nullopt: host-only row
  std::optional<Numerics> planned;   // what the plan says it computes, when it says so
  int64_t bytes = 0;                 // scorer_bytes: K + V (if read) + Q, each once
  double score_us = 0, select_us = 0, total_us = 0;
  /// total_us again in the same run with every launch issued one by one (the worker's launch
  /// graphs off); 0 when not measured (host-decided rows, launch graphs off anyway).
  double direct_us = 0;
  /// Launch sequences the timed repetitions replayed from a CUDA graph / issued directly.
  int64_t graph_replays = 0, graph_direct = 0;
  double score_gbps = 0, total_gbps = 0;
  int64_t scratch_bytes = 0;
  int input_sets = 0;
  bool host_decided = false;         // select = scores to host + host decision (host clock)
  std::vector<StageTime> stages;     // --stages: per-launch medians
  std::string error;                 // empty when the configuration ran and checked out
  std::string note;                  // how the row was measured, when not the default
};

/// "" when offsets [lists + 1] and indices are well formed (every list strictly ascending in
/// [0, n), the offsets ending at `expected_total` unless it is negative); else why not.
std::string CheckAnswer(const std::vector<int64_t>& offsets, const std::vector<int32_t>& indices,
                        int64_t n, int64_t expected_total);

/// The JSON object of one row; copy_gbps is the same run's device-to-device bandwidth.
nlohmann::json RowJson(const Row& r, double copy_gbps);

/// Run-level facts written beside the rows.
struct RunInfo {
  std::string device;
  double copy_gbps = 0;
  int64_t copy_mib = 0;
  int reps = 0, warmup = 0, stage_reps = 0;
  double keep_fraction = 0;
  bool stages = false;
  bool complete = false;  // false while rows are still being measured
};

/// Writes DIR/gpu_bench.json and DIR/gpu_bench.csv from `rows` (rewritten after each row, so
/// that a run stopped at its time cap leaves what it measured). False when a file could not
/// be written.
bool WriteResults(const std::string& dir, const RunInfo& info, const std::vector<Row>& rows);

}  // namespace kvtrim::gpu::bench
