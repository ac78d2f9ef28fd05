// A same-run gRPC round-trip reference for the load generator's latencies: what one call
// costs on a connection like a worker's when the server does no work.
#pragma once

#include <string>

#include "client/loadgen/config.h"
#include "client/loadgen/stats.h"

namespace kvtrim::loadgen {

/// Round trips of an empty call, measured in this process before the workers start.
struct RpcFloor {
  int calls = 0;           // calls timed (after the warm-up)
  Summary round_trip_s;    // per call, seconds
  std::string error;       // why nothing was measured; empty when it was
};

/// Times `calls` grpc.health.v1 Health checks (after `warmup` untimed ones) on one
/// connection opened as a worker opens its own (config.target, HTTP/2 window, own
/// connection). The server answers them from memory, so the round trip is gRPC's floor
/// for any answer: the framing, the two loopback hops and both sides' threads.
RpcFloor MeasureRpcFloor(const LoadgenConfig& config, int warmup = 50, int calls = 500);

}  // namespace kvtrim::loadgen
