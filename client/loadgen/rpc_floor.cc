// MeasureRpcFloor (rpc_floor.h).
#include "client/loadgen/rpc_floor.h"

#include <chrono>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/kvtrim_client.h"

namespace kvtrim::loadgen {

RpcFloor MeasureRpcFloor(const LoadgenConfig& config, int warmup, int calls) {
  RpcFloor out;
  ClientOptions options;
  options.max_message_bytes = config.max_message_bytes;
  options.http2_window_bytes = config.http2_window_bytes;
  options.own_connection = !config.shared_connection;
  options.default_deadline = absl::Seconds(config.timeout_s);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(config.target, options);
  if (!client.ok()) {
    out.error = client.status().ToString();
    return out;
  }
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(calls));
  for (int i = 0; i < warmup + calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<HealthState> state = (*client)->Health();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (!state.ok()) {
      out.error = state.status().ToString();
      return out;
    }
    if (i >= warmup) samples.push_back(took.count());
  }
  out.calls = calls;
  out.round_trip_s = Summarize(std::move(samples));
  return out;
}

}  // namespace kvtrim::loadgen
