// One load generator worker: its own channel (and, for region transports, its own lease
// and buffers) playing closed-loop prefills against kvtrimd.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/loadgen/config.h"
#include "client/loadgen/stage_profile.h"
#include "client/loadgen/synthetic.h"

namespace kvtrim::loadgen {

/// The measurements of one prefill (one CompressSession).
struct PrefillSample {
  double wall_s = 0;                    // OpenSession to Finish's return
  int64_t wire_bytes = 0;               // tensor bytes on the wire (inline data)
  std::vector<double> layer_latency_s;  // [L] start of preparing layer l -> its answer
  std::vector<double> layer_prepare_s;  // [L] building layer l's message (copy, event record)
  // --serial: [L] start of preparing layer l -> WaitForAnswer returned in the caller's thread
  // (layer_latency_s stops when the session's reader thread receives the answer).
  std::vector<double> serial_wait_latency_s;
  std::vector<double> serial_send_s;    // --serial: [L] SendLayer of layer l (its write)
  std::vector<double> compute_s;        // [L] server-reported LayerResult.compute_seconds
  int64_t tokens_in = 0;                // SessionSummary.tokens_in
  int64_t tokens_kept = 0;              // SessionSummary.tokens_kept
  int64_t fast_layers = 0;              // layers the server computed NUMERICS_FAST
  int64_t exact_layers = 0;             // layers the server computed NUMERICS_EXACT
  StageProfile stages;                  // LayerResult.profile of each layer (config.profile)
};

/// Everything one worker measured, or why it stopped.
struct WorkerResult {
  int worker = 0;
  absl::Status status;                  // the first error; OK when every prefill ran
  std::vector<PrefillSample> prefills;  // measured prefills only
  std::vector<std::string> notes;       // the transport's remarks
  std::string backend;                  // SessionSummary.backend
  double start_s = 0;                   // measured phase start, seconds after the common start
  double end_s = 0;                     // measured phase end, seconds after the common start
};

/// Holds workers until all of them finished setting up and warming up, so that the
/// measured phases start together. Thread-safe.
class StartLine {
 public:
  /// A start line for `workers` workers.
  explicit StartLine(int workers) : waiting_(workers) {}
  /// Blocks until every worker arrived (failed ones too); returns the common start time.
  absl::Time Arrive();

 private:
  std::mutex mu_;
  std::condition_variable all_arrived_;
  int waiting_;
  absl::Time start_;
};

/// Runs worker `index`: connects, makes its transport's layer source, plays
/// config.warmup_prefills unmeasured prefills, arrives at `start_line`, then plays
/// config.prefills measured prefills; fills `out`. `layer` holds the tensors the policy
/// needs (keys, and values / queries when it uses them).
void RunWorker(int index, const LoadgenConfig& config, const HostLayer& layer,
               StartLine* start_line, WorkerResult* out);

}  // namespace kvtrim::loadgen
