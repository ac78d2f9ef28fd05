// The load generator's results: aggregation over workers, the printed table and the JSON.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "client/loadgen/config.h"
#include "client/loadgen/memcpy_bench.h"
#include "client/loadgen/rpc_floor.h"
#include "client/loadgen/stage_profile.h"
#include "client/loadgen/stats.h"
#include "client/loadgen/worker.h"
#include "nlohmann/json.hpp"

namespace kvtrim::loadgen {

/// Everything one run measured, as main collects it.
struct RunReport {
  LoadgenConfig config;
  PolicyNeeds needs;
  std::vector<WorkerResult> workers;
  MemcpyBandwidth memcpy;            // one core copying
  MemcpyBandwidth memcpy_all_cores;  // every core copying at once
  RpcFloor rpc_floor;  // the gRPC round trip of an empty call on a worker-like connection
  std::vector<std::string> notes;  // run-wide remarks
};

/// One worker's totals over its measured prefills.
struct WorkerTotals {
  int worker = 0;
  int64_t prefills = 0;
  int64_t wire_bytes = 0;
  double wall_s = 0;       // its measured phase: end_s - start_s
  double bytes_per_s = 0;  // wire_bytes / wall_s
};

/// The run's statistics over every measured prefill of every worker.
struct RunTotals {
  Summary layer_latency_s;  // every layer of every measured prefill
  Summary layer_prepare_s;
  Summary serial_wait_latency_s;  // --serial: until WaitForAnswer returned (count 0 otherwise)
  Summary serial_send_s;          // --serial: SendLayer alone (count 0 otherwise)
  Summary compute_s;       // server-reported compute_seconds
  Summary prefill_wall_s;  // every measured prefill
  int64_t prefills = 0;
  int64_t wire_bytes = 0;              // all measured prefills of all workers
  int64_t wire_bytes_per_prefill = 0;  // of one prefill (every prefill sends the same)
  double run_wall_s = 0;               // common start -> last worker's end
  double bytes_per_s = 0;              // wire_bytes / run_wall_s
  std::vector<WorkerTotals> workers;
  std::string backend;  // the first non-empty backend a worker saw
  int64_t fast_layers = 0;   // measured layers the server computed NUMERICS_FAST
  int64_t exact_layers = 0;  // measured layers the server computed NUMERICS_EXACT
  StageProfile stages;       // per-stage times of the measured layers that carried a profile
};

/// Aggregates `report`'s workers (failed workers contribute the prefills they completed).
RunTotals Aggregate(const RunReport& report);

/// A readable table of the configuration and `totals`.
void PrintReport(const RunReport& report, const RunTotals& totals, std::ostream& out);

/// One JSON object with the configuration and every number of `totals` (see
/// kvtrim-loadgen --help for the keys).
nlohmann::json ReportJson(const RunReport& report, const RunTotals& totals);

}  // namespace kvtrim::loadgen
