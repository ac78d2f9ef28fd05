// The reading half of a CompressSession: a thread that reads the stream, assembles chunked
// tensors and decodes (maps / reads regions of) layer l + 1 while layer l is computed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "kernels/engine.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "service/tensor_codec.h"

namespace kvtrim::service {

/// One message of the session, read and (for layers) decoded, in stream order.
struct SessionItem {
  enum class Kind {
    kBegin,   // `request` holds begin
    kLayer,   // `request` holds the layer; `decoded` / `status` its decoding
    kFinish,  // finish
    kEmpty,   // a SessionRequest with no message set
    kEnd,     // the stream ended (client half-close, cancellation or deadline)
    kError,   // a chunking protocol error (`status`), after which nothing more is read
  };
  Kind kind = Kind::kEnd;
  std::unique_ptr<v1::SessionRequest> request;  // owns what `decoded` views alias
  std::unique_ptr<DecodedLayer> decoded;        // kLayer, when `status` is OK
  absl::Status status;                          // kLayer: decoding; kError: the error
  int64_t wire_bytes = 0;                       // inline tensor bytes (layer + chunks)
  double decode_seconds = 0;                    // assembling and decoding this layer
  std::chrono::steady_clock::time_point received;  // the layer message read
  std::chrono::steady_clock::time_point ready;     // decoded and through the front end
  // Set by the front end (on the reading thread):
  std::shared_ptr<const ResolvedPolicy> policy;  // kBegin / kLayer: the session's policy
  std::unique_ptr<ValidatedLayer> validated;     // kLayer: the engine's validated layer
  double validate_seconds = 0;
};

/// Reads a session's requests on its own thread into a bounded queue. Every item goes
/// through `front_end` on that thread before it is queued (the session's protocol checks
/// and the engine's validation); an item the front end turns into kError is the last one.
/// Errors found while reading therefore end the call without a blocked Read, so their
/// status reaches the client as is.
/// (at most
/// `max_pending_layers` decoded layers wait, so a fast client is slowed by gRPC flow
/// control, not by memory). Layers are decoded with `context` (regions, client id) and
/// `limits`; tensors marked `chunked` are assembled from the tensor_chunk messages that
/// follow their layer (each at most `max_layer_bytes` in total). Stop() (or destruction)
/// cancels the call when the reader is still blocked on the client and joins the thread.
class SessionReader {
 public:
  using Stream = grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>;

  using FrontEnd = std::function<void(SessionItem*)>;

  SessionReader(grpc::ServerContext* server_context, Stream* stream, const EngineLimits& limits,
                DecodeContext context, int64_t max_layer_bytes, int max_pending_layers,
                FrontEnd front_end);
  ~SessionReader();
  SessionReader(const SessionReader&) = delete;
  SessionReader& operator=(const SessionReader&) = delete;

  /// Starts the reading thread.
  void Start();
  /// The next item in stream order; blocks until one is read. After kEnd or kError, every
  /// further call returns kEnd.
  SessionItem Next();
  /// Stops reading: cancels the call if the thread is still reading (the client then sees
  /// CANCELLED: only for failures after reading, e.g. a backend fault), joins it.
  void Stop();

 private:
  /// Thread body.
  void Run();
  /// Reads the tensor_chunk messages of `item`'s chunked tensors; OK when all are complete.
  absl::Status AssembleChunks(SessionItem* item, std::array<HostBuffer, 3>* chunks);
  /// Queues an item (blocks while the queue holds max_pending_layers layers); false when
  /// stopping.
  bool Push(SessionItem item);

  grpc::ServerContext* server_context_;
  Stream* stream_;
  EngineLimits limits_;
  DecodeContext context_;
  int64_t max_layer_bytes_;
  int max_pending_layers_;
  FrontEnd front_end_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<SessionItem> queue_;
  int pending_layers_ = 0;
  bool stopping_ = false;
  bool done_ = false;      // the thread pushed kEnd / kError and exited
  bool delivered_end_ = false;
};

}  // namespace kvtrim::service
