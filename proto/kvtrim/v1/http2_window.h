// The gRPC channel arguments of a fixed HTTP/2 flow-control window, shared by kvtrimd
// (--http2_window_bytes) and the client library (ClientOptions::http2_window_bytes).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include <grpc/grpc.h>

namespace kvtrim::v1 {

/// The largest HTTP/2 frame (RFC 9113: 2^24 - 1 bytes).
inline constexpr int kMaxHttp2FrameBytes = (1 << 24) - 1;

/// Arguments for a window of `bytes` (> 0): the stream lookahead (gRPC's per-stream
/// window), frames up to min(bytes, 16 MiB - 1), and no BDP probe (which would shrink or
/// grow the window on its own).
inline std::vector<std::pair<const char*, int>> Http2WindowArguments(int bytes) {
  return {{GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, bytes},
          {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, std::min(bytes, kMaxHttp2FrameBytes)},
          {GRPC_ARG_HTTP2_BDP_PROBE, 0}};
}

}  // namespace kvtrim::v1
