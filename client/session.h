// A client-side CompressSession: streams one prefill's layers and collects the answers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"

namespace kvtrim {

/// Everything a finished session answered.
struct SessionResult {
  /// One result per layer sent, in the order the server answered them.
  std::vector<v1::LayerResult> layers;
  /// The server's closing summary (layers answered, tokens in and kept, backend).
  v1::SessionSummary summary;
  /// layer_id -> seconds from the start of SendLayer to the arrival of that layer's result.
  /// Model-wide policies answer at Finish, so their round trips include the later layers.
  std::map<int32_t, double> round_trip_seconds;
};

/// True for the server's answer to a model digest it does not hold: FAILED_PRECONDITION
/// whose message contains "unknown model digest".
bool IsUnknownModelDigest(const absl::Status& status);

/// How a session may recover once from "unknown model digest" (the server restarted or
/// lost the model): `reregister` registers the model again and returns OK when the session
/// may be opened anew. The session then replays `begin` and every layer sent so far on a new
/// stream -- but only while no layer answer has arrived (so nothing is answered twice) and
/// the layers sent so far total at most `max_replay_bytes` (they are kept until the first
/// answer arrives); past either point the failure is returned as is.
struct SessionRetry {
  std::function<absl::Status()> reregister;
  int64_t max_replay_bytes = int64_t{256} << 20;
};

/// A layer's tensor bytes that stay in the caller's memory (a KV cache's host copy): each
/// non-empty span is sent as its tensor's tensor_chunk messages, copied once from that
/// memory into gRPC's send buffers (no protobuf message is built around them). Dense row-major little-endian bytes of the tensor's shape
/// and dtype, as inline_data would hold.
struct LayerTensorBytes {
  absl::Span<const char> keys;
  absl::Span<const char> values;
  absl::Span<const char> queries;
};

/// How Session::Open opens and feeds its stream.
struct SessionOptions {
  /// Deadline of the whole stream, from Open to Finish.
  absl::Duration deadline = absl::Minutes(10);
  /// Recovery from "unknown model digest" (none when `retry.reregister` is unset).
  SessionRetry retry;
  /// Inline tensors longer than this many bytes go as tensor_chunk messages of at most
  /// this many data bytes after their layer message (FrameTensorChunk); <= 0
  /// sends every layer as one message (LayerTensorBytes then go in chunks of
  /// kDefaultChunkBytes). Each message must fit the server's --max_message_bytes.
  int64_t chunk_bytes = 0;
  /// When non-empty, sent as gRPC metadata `kvtrim-client-id` (a RegionLease's client id:
  /// the server resolves region tensors only within that client's regions).
  std::string client_id;
  /// When non-empty, sent as gRPC metadata `authorization` ("Bearer <token>").
  std::string authorization;
};

/// One open CompressSession stream. A background thread reads the server's replies as they
/// come, so the server is never blocked on an unread stream; SendLayer only writes.
/// Use from one thread: SendLayer any number of times, then Finish once. Destroying an
/// unfinished session cancels the stream.
class Session {
 public:
  /// Requests go out as wire bytes (so that chunk data can be sent from the caller's
  /// memory); replies are parsed as SessionResponse.
  using Stream = grpc::ClientReaderWriter<grpc::ByteBuffer, v1::SessionResponse>;

  /// Chunk size of LayerTensorBytes when SessionOptions.chunk_bytes is <= 0.
  static constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;

  /// Starts the stream on `channel` with a deadline of now + `deadline` and sends `begin`.
  /// Created by Client::OpenSession. With `retry`
  /// (reregister set), a FAILED_PRECONDITION "unknown model digest" failure before any
  /// layer answer re-registers and replays once (see SessionRetry); the deadline stays
  /// the original one.
  static absl::StatusOr<std::unique_ptr<Session>> Open(std::shared_ptr<grpc::Channel> channel,
                                                       const v1::CompressionSettings& settings,
                                                       absl::Duration deadline,
                                                       SessionRetry retry = {});

  /// As above, with every option of SessionOptions (chunking, client id metadata).
  static absl::StatusOr<std::unique_ptr<Session>> Open(std::shared_ptr<grpc::Channel> channel,
                                                       const v1::CompressionSettings& settings,
                                                       SessionOptions options);

  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Sends one layer (pass an rvalue to avoid copying its tensors): its layer message and,
  /// with options.chunk_bytes > 0, the tensor_chunk messages of its large inline tensors.
  /// When the server has already ended the stream (it rejected an earlier message),
  /// returns the stream's final status, e.g. INVALID_ARGUMENT naming the field;
  /// FAILED_PRECONDITION after Finish.
  absl::Status SendLayer(v1::LayerInput layer);

  /// Sends one layer whose tensor bytes stay in the caller's memory: `layer` names each
  /// tensor's shape and dtype (no inline_data for a tensor with bytes in `bytes`), and each
  /// non-empty span goes as tensor_chunk messages copied once from the caller's memory
  /// (the memory is the caller's again when this returns). INVALID_ARGUMENT when a span
  /// has no tensor in `layer` or its tensor also carries inline_data; otherwise as
  /// SendLayer above.
  absl::Status SendLayer(v1::LayerInput layer, const LayerTensorBytes& bytes);

  /// Blocks until the answer of layer `layer_id` (already sent) has arrived. For per-layer
  /// policies only: model-wide policies answer at Finish, so this would wait for the
  /// deadline. The stream's error status when it ends first (INTERNAL when it ended OK
  /// without that answer); FAILED_PRECONDITION after Finish.
  absl::Status WaitForAnswer(int32_t layer_id);

  /// WaitForAnswer, then that layer's result (per-layer policies: model-wide ones answer at
  /// Finish). The result stays in the session's answers (Finish returns it too).
  absl::StatusOr<v1::LayerResult> Answer(int32_t layer_id);

  /// Sends `finish`, waits for the remaining results and the summary, and returns them.
  /// Returns the stream's error status when it failed, INTERNAL when the server closed a
  /// successful stream without a summary, FAILED_PRECONDITION when called twice.
  absl::StatusOr<SessionResult> Finish();

 private:
  Session() = default;

  /// Opens the stream and the reader thread and writes `begin`; false when the write failed.
  bool StartStream();
  /// Reader thread body: stores every reply until the stream ends.
  void ReadLoop();
  /// Joins the reader and collects the final stream status (once per stream).
  absl::Status CloseStream();
  /// After the stream failed with `status`: when the retry applies, re-registers, opens a
  /// new stream and replays begin and the layers sent so far; returns OK when the session
  /// goes on, else `status` (or the re-registration / replay error).
  absl::Status RecoverOnce(const absl::Status& status);
  /// Drops the replay buffer and the retry (an answer arrived, or the buffer grew too big).
  void DisarmRetry();
  /// Writes the layer message and the chunks of `bytes`; `id` names the layer in errors.
  absl::Status WriteLayer(v1::LayerInput layer, const LayerTensorBytes& bytes);

  std::shared_ptr<grpc::Channel> channel_;
  v1::SessionRequest begin_;
  absl::Time deadline_;
  SessionRetry retry_;
  int64_t chunk_bytes_ = 0;
  std::string client_id_;
  std::string authorization_;  // "Bearer <token>" or empty
  /// A message kept for the replay.
  struct ReplayMessage {
    grpc::ByteBuffer bytes;
    bool is_layer = false;  // the layer message (not one of its chunks)
    int32_t layer_id = 0;
  };
  std::vector<ReplayMessage> replay_;  // messages sent while the retry is armed
  int64_t replay_bytes_ = 0;

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<Stream> stream_;
  std::thread reader_;
  bool closed_ = false;      // CloseStream ran
  bool finished_ = false;    // Finish returned the result
  absl::Status final_status_;

  absl::Mutex mu_;
  SessionResult result_ ABSL_GUARDED_BY(mu_);
  bool have_summary_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;  // a layer answer or the summary arrived
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;  // the current stream's reads ended
  std::set<int32_t> answered_ids_ ABSL_GUARDED_BY(mu_);  // layer ids answered so far
  std::string protocol_error_ ABSL_GUARDED_BY(mu_);  // unexpected reply order
  // SessionResponse.error: the failure's own status (the call's may be CANCELLED).
  absl::Status server_error_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, absl::Time> sent_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtrim
