// CompressSession: a bidirectional stream, begin -> layer* -> finish. Two lanes on the
// work pool per call: the front end (assembling, decoding, protocol checks, validation of
// layer l + 1) and the computation (layer l, and for per-layer policies up to
// --session_parallel_layers layers at once, answered in stream order), so they overlap;
// neither holds a thread while the session waits for its client.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/status_macros.h"
#include "service/layer_runner.h"
#include "service/reactors.h"
#include "service/rpcs.h"
#include "service/session_front_end.h"
#include "service/session_input.h"
#include "service/session_wire.h"

namespace kvtrim::service {

namespace {

using Clock = std::chrono::steady_clock;

/// True when taking `message` costs microseconds: no tensor bytes to copy, read or scan.
bool CheapToDecode(const v1::SessionRequest& message) {
  if (message.message_case() == v1::SessionRequest::kTensorChunk) return false;
  if (message.message_case() != v1::SessionRequest::kLayer) return true;
  const v1::LayerInput& layer = message.layer();
  for (const v1::Tensor* tensor : {&layer.keys(), &layer.values(), &layer.queries()}) {
    const auto data = tensor->data_case();
    if (data != v1::Tensor::DATA_NOT_SET && data != v1::Tensor::kCudaIpc) return false;
  }
  return true;
}

/// Messages smaller than this are parsed on gRPC's thread (to see whether they are cheap
/// to take there); larger ones are parsed on the work pool.
constexpr size_t kParseOnGrpcThreadBytes = 64 << 10;

/// Layers with more host bytes than this are computed one at a time (WindowFor).
constexpr int64_t kParallelHostBytes = int64_t{8} << 20;

/// tensor_chunk messages read ahead while earlier ones are still being copied.
constexpr int kChunksReadAhead = 2;

/// One message read from the stream (or its end), on its way to the front lane.
struct Incoming {
  bool ok = false;  // false: the stream ended
  std::chrono::steady_clock::time_point received;
  grpc::ByteBuffer bytes;                   // the message's wire bytes
  std::optional<WireTensorChunk> chunk;     // a tensor_chunk, read from `bytes` directly
  std::unique_ptr<v1::SessionRequest> request;  // any other message, once parsed
  absl::Status parsed;                      // the parse's status, when `request` is set
};

/// The reactor of one session. Messages arrive as wire bytes: a tensor_chunk's data is
/// copied once, from gRPC's buffers into the layer's tensor, and up to kChunksReadAhead
/// chunks are read while earlier ones are copied. At most `--session_read_ahead` decoded
/// layers wait for the computation; beyond that no read is started (but one message), so a
/// fast client is slowed by gRPC flow control, not by memory. A failure ends the call with
/// its own status, after a last `error` message carrying the same code and message.
class SessionCall final : public BidiStream<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionCall(ServiceCore& core, grpc::CallbackServerContext* context)
      : core_(core),
        context_(context),
        guard_(core, CallSlot::kInflight, *context),
        input_(core.engine().limits(), core.MakeDecodeContext(*context, guard_.tenant()),
               core.transport_options().max_layer_bytes),
        front_end_(core),
        runner_(core),
        read_ahead_(std::max(1, core.transport_options().session_read_ahead)),
        parallel_layers_(std::max(1, core.transport_options().session_parallel_layers)),
        front_lane_(core.pool()),
        compute_lane_(core.pool()) {
    summary_.set_backend(std::string(core_.engine().backend_name()));
    if (!guard_.status().ok()) {
      End(guard_.status(), /*tell_client=*/false);
      return;
    }
    if (!guard_.must_wait()) {
      guard_.AwaitSlot(*context_);  // admitted already: records the (zero) wait
      RequestReadOnce();
      return;
    }
    // Nothing is read before the call holds a slot; the wait for one blocks a pool thread.
    Hold();
    front_lane_.Post([this] {
      if (const absl::Status& admitted = guard_.AwaitSlot(*context_); admitted.ok()) {
        RequestReadOnce();
      } else {
        End(admitted, /*tell_client=*/false);
      }
      Release();
    });
  }

  /// The client cancelled or its deadline passed: the slot goes back at once, although a
  /// layer may still be computing (the client can open its next call now; CallGuard). The
  /// session then ends at its next step, and counts for a drain until gRPC is done.
  void OnCancel() override { guard_.ReleaseSlot(); }

  void OnReadDone(bool ok) override {
    auto incoming = std::make_shared<Incoming>();
    incoming->received = Clock::now();
    incoming->ok = ok;
    bool cheap = !ok;
    bool read_early = false;
    if (ok) {
      incoming->bytes.Swap(&incoming_);
      incoming->chunk = PeekTensorChunk(incoming->bytes);
      if (incoming->chunk.has_value()) {
        std::lock_guard<std::mutex> lock(mutex_);
        ++chunks_waiting_;
        read_early = !read_paused_ && chunks_waiting_ <= kChunksReadAhead;
      } else if (incoming->bytes.Length() <= kParseOnGrpcThreadBytes) {
        incoming->request = std::make_unique<v1::SessionRequest>();
        incoming->parsed = ParseSessionRequest(incoming->bytes, incoming->request.get());
        cheap = !incoming->parsed.ok() || CheapToDecode(*incoming->request);
      }
    }
    Hold();
    auto task = [this, incoming] {
      FrontEnd(incoming.get());
      Release();
    };
    // A message whose decoding is a few lookups (CUDA IPC tensors, begin, finish) is taken
    // on gRPC's thread when the front end is idle: no hand-off to the pool. Reading host
    // shm, copying chunks, parsing or scanning inline bytes goes to the pool.
    if (cheap) {
      front_lane_.RunOrPost(std::move(task));
    } else {
      front_lane_.Post(std::move(task));
    }
    // Only now may the next read start: its message is queued after this one.
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      read_outstanding_ = false;
      start = ok && (read_wanted_ || read_early);
      read_wanted_ = false;
      read_outstanding_ = start;
    }
    if (start) StartReadNow();
  }

 private:
  /// Starts a read, or (while one is outstanding, i.e. its message not yet queued) asks
  /// OnReadDone to start it once that message is queued.
  void RequestReadOnce() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (read_outstanding_) {
        read_wanted_ = true;
        return;
      }
      read_outstanding_ = true;
    }
    StartReadNow();
  }

  /// Starts the read claimed by setting read_outstanding_ (released when none starts).
  void StartReadNow() {
    if (!RequestRead()) {
      std::lock_guard<std::mutex> lock(mutex_);
      read_outstanding_ = false;
    }
  }

  /// The item `incoming` completes, if any: a chunk copied into its layer, a message parsed
  /// and taken, or the end of the stream.
  std::optional<SessionItem> Take(Incoming* incoming) {
    if (!incoming->ok) return input_.End(context_->IsCancelled());
    if (incoming->chunk.has_value()) {
      const WireTensorChunk& chunk = *incoming->chunk;
      const ChunkHeader header{chunk.layer_id, chunk.slot, chunk.offset_bytes, chunk.data_bytes};
      std::optional<SessionItem> item = input_.TakeChunk(header, [&](char* destination) {
        return CopyTensorChunkData(incoming->bytes, chunk, destination);
      });
      std::lock_guard<std::mutex> lock(mutex_);
      --chunks_waiting_;
      return item;
    }
    if (incoming->request == nullptr) {
      incoming->request = std::make_unique<v1::SessionRequest>();
      incoming->parsed = ParseSessionRequest(incoming->bytes, incoming->request.get());
    }
    if (!incoming->parsed.ok()) {
      SessionItem failed;
      failed.kind = SessionItem::Kind::kError;
      failed.status = incoming->parsed;
      return failed;
    }
    incoming->bytes.Clear();
    return input_.Take(std::move(incoming->request), incoming->received);
  }

  /// Front lane: one message (or the end of the stream) into an item for the computation.
  void FrontEnd(Incoming* incoming) {
    if (ended_.load()) return;
    std::optional<SessionItem> item = Take(incoming);
    if (!item.has_value()) {  // a layer's chunks are still coming
      bool paused = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        paused = read_paused_;
      }
      if (!paused) RequestReadOnce();
      return;
    }
    front_end_.Process(&*item);
    item->ready = Clock::now();
    bool read_now = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (item->kind == SessionItem::Kind::kLayer) ++pending_layers_;
      if (!item->last()) {
        read_now = pending_layers_ < read_ahead_;
        read_paused_ = !read_now;
      }
      items_.push_back(std::move(*item));
    }
    Hold();
    compute_lane_.Post([this] {
      Compute();
      Release();
    });
    if (read_now) RequestReadOnce();
  }

  /// How many layer jobs may be in flight when `item` starts: parallel_layers_, but 1 for a
  /// layer with more than kParallelHostBytes of host bytes (inline data, or host shm read
  /// with pread), whose upload would compete for the host with the wire and the next layer's
  /// assembly (on the H100 host two 134 MB inline layers at once moved 1.45 GB/s, one at a
  /// time 1.86 GB/s). Device-read layers (CUDA IPC, page-locked host shm) and small ones
  /// run side by side.
  int WindowFor(const SessionItem& item) const {
    if (item.validated == nullptr) return 1;
    int64_t host_bytes = 0;
    for (const TensorView* t :
         {&item.validated->keys, &item.validated->values, &item.validated->queries}) {
      if (t->present() && t->host_readable()) host_bytes += t->nbytes();
    }
    return host_bytes > kParallelHostBytes ? 1 : parallel_layers_;
  }

  /// Compute lane: the items in stream order, as far as the layers in flight allow (a layer
  /// waits for a free place in its window, WindowFor; anything else for every layer in
  /// flight to be answered); a layer job that finishes runs this again.
  void Compute() {
    while (true) {
      SessionItem item;
      bool read_now = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (items_.empty()) return;
        const bool layer = items_.front().kind == SessionItem::Kind::kLayer;
        if (layer ? layers_in_flight_ >= WindowFor(items_.front()) : layers_in_flight_ > 0) return;
        item = std::move(items_.front());
        items_.pop_front();
        if (layer) --pending_layers_;
        if (read_paused_ && pending_layers_ < read_ahead_) {
          read_paused_ = false;
          read_now = true;
        }
      }
      if (read_now) RequestReadOnce();
      if (ended_.load()) return;  // what follows the end is dropped
      bool finished = false;
      const absl::Status status = Handle(&item, &finished);
      if (!status.ok() || finished) {
        End(status, /*tell_client=*/true);
        return;
      }
    }
  }

  /// One item in stream order; `finished` once the summary is sent.
  absl::Status Handle(SessionItem* item, bool* finished) {
    switch (item->kind) {
      case SessionItem::Kind::kBegin:
        label_ = core_.PolicyLabel(item->request->begin().policy().name());
        request_id_ = item->request->begin().request_id();
        policy_ = item->policy;
        return absl::OkStatus();
      case SessionItem::Kind::kLayer:
        return Layer(item);
      case SessionItem::Kind::kFinish:
        *finished = true;
        return FinishSession(*item);
      case SessionItem::Kind::kError:
        core_.metrics().AddRequestBytes(Rpc::kCompressSession, item->wire_bytes);
        if (item->request != nullptr && item->request->has_begin()) {
          label_ = core_.PolicyLabel(item->request->begin().policy().name());
          request_id_ = item->request->begin().request_id();
        }
        return item->status;
      case SessionItem::Kind::kEnd:
      default:
        KVTRIM_RETURN_IF_ERROR(CheckCallAlive(*context_, "the end of the stream"));
        return absl::InvalidArgumentError(
            "finish: the client closed the stream without sending finish; layers already "
            "answered stand, the session is abandoned");
    }
  }

  /// A validated layer: answered now, or (model-wide policies) scored for the finish.
  absl::Status Layer(SessionItem* item) {
    core_.metrics().AddRequestBytes(Rpc::kCompressSession, item->wire_bytes);
    core_.CountTransportBytes(item->decoded->transport);
    KVTRIM_RETURN_IF_ERROR(CheckCallAlive(*context_, "layer"));
    policy_ = item->policy;  // num_layers grows with the layers seen when begin left it 0
    const ResolvedPolicy& policy = *item->policy;
    if (policy.model_wide()) {
      // Answered at finish: keep this layer's scores only (never K/V).
      return runner_.ScoreValidated(policy, *item->validated, item->validate_seconds, &buffered_);
    }
    // Computed beside the lane (the next layers start while this one runs); the answers
    // go out in stream order (Answer).
    const int64_t seq = next_seq_++;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++layers_in_flight_;
    }
    Hold();
    auto shared = std::make_shared<SessionItem>(std::move(*item));
    core_.pool().Post([this, seq, shared] {
      LayerOutcome outcome;
      outcome.status = ComputeLayer(shared.get(), &outcome);
      shared->validated.reset();
      shared->decoded.reset();  // releases the layer's region pins and buffers
      Answer(seq, std::move(outcome));
      bool resume = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --layers_in_flight_;
        resume = !items_.empty();
      }
      if (resume) {
        Hold();
        compute_lane_.Post([this] {
          Compute();
          Release();
        });
      }
      Release();
    });
    return absl::OkStatus();
  }

  /// A computed layer: its status, and on success the decision and the serialised answer.
  struct LayerOutcome {
    absl::Status status;
    std::optional<LayerDecision> decision;
    grpc::ByteBuffer answer;
  };

  /// Computes one validated per-layer item (any pool thread), writes a host_shm output
  /// region, and encodes the answer into `out`.
  absl::Status ComputeLayer(SessionItem* item, LayerOutcome* out) {
    const ResolvedPolicy& policy = *item->policy;
    const auto start = Clock::now();
    auto decision = runner_.CompressValidated(policy, *item->validated, item->validate_seconds);
    if (!decision.ok()) return decision.status();
    if (item->decoded->host_output.has_value()) {
      KVTRIM_RETURN_IF_ERROR(WriteHostOutput(*item->decoded->host_output, "layer", &*decision));
    }
    decision->profile.decode = item->decode_seconds;
    decision->profile.queued =
        std::max(0.0, std::chrono::duration<double>(start - item->ready).count());
    v1::SessionResponse response;
    runner_.Encode(policy.settings, item->received, &*decision, response.mutable_layer());
    out->answer = SerializeSessionResponse(response);
    out->decision = *std::move(decision);
    return absl::OkStatus();
  }

  /// Stores layer `seq`'s outcome and sends every answer now due, in stream order; the
  /// first failure in that order ends the session (the layers after it are dropped).
  void Answer(int64_t seq, LayerOutcome outcome) {
    std::lock_guard<std::mutex> lock(answer_mutex_);
    const size_t slot = static_cast<size_t>(seq - answered_seq_);
    if (outcomes_.size() <= slot) outcomes_.resize(slot + 1);
    outcomes_[slot] = std::move(outcome);
    while (!outcomes_.empty() && outcomes_.front().has_value()) {
      LayerOutcome& due = *outcomes_.front();
      if (!ended_.load()) {
        if (!due.status.ok()) {
          End(due.status, /*tell_client=*/true);
        } else {
          Send(std::move(due.answer));
          Count(*due.decision);
        }
      }
      outcomes_.pop_front();
      ++answered_seq_;
    }
  }

  /// finish: the model-wide decision's layers, then the summary (every layer in flight has
  /// been answered: Compute runs it only then).
  absl::Status FinishSession(const SessionItem& item) {
    std::lock_guard<std::mutex> lock(answer_mutex_);
    if (policy_ != nullptr && policy_->model_wide()) {
      auto decided = runner_.DecideModelWide(*policy_, &buffered_);
      if (!decided.ok()) return decided.status();
      for (LayerDecision& decision : *decided) {
        v1::SessionResponse response;
        runner_.Encode(policy_->settings, item.received, &decision, response.mutable_layer());
        Send(SerializeSessionResponse(response));
        Count(decision);
      }
    }
    v1::SessionResponse response;
    *response.mutable_finished() = summary_;
    guard_.ReleaseSlot();  // before the summary: a client may open its next call on reading it
    Send(SerializeSessionResponse(response));
    return absl::OkStatus();
  }

  /// Records an answered layer in the metrics and the summary (under answer_mutex_).
  void Count(const LayerDecision& decision) {
    core_.metrics().RecordLayer(
        label_, decision,
        policy_ != nullptr && policy_->model != nullptr ? policy_->model->digest : "");
    summary_.set_layers(summary_.layers() + 1);
    for (int32_t kept : decision.kept_per_head) {
      summary_.set_tokens_in(summary_.tokens_in() + decision.num_tokens);
      summary_.set_tokens_kept(summary_.tokens_kept() + kept);
    }
  }

  /// Ends the session with `status`: a failure is first sent as a last `error` message
  /// (`tell_client`), then the call finishes with the same status. Once.
  void End(const absl::Status& status, bool tell_client) {
    if (ended_.exchange(true)) return;
    // The slot goes back before the last message: a client may open its next call as soon as
    // it reads the `error` (or, on success, the summary FinishSession sent).
    guard_.ReleaseSlot();
    const grpc::Status wire = ToGrpcStatus(status);
    if (!status.ok() && tell_client) {
      v1::SessionResponse failure;
      failure.mutable_error()->set_code(static_cast<int32_t>(wire.error_code()));
      failure.mutable_error()->set_message(wire.error_message());
      Send(SerializeSessionResponse(failure));  // dropped when the client is gone
    }
    core_.LogServerError(Rpc::kCompressSession, request_id_, status);
    core_.metrics().RecordRequest(Rpc::kCompressSession, label_, status.code(),
                                  SecondsSince(start_));
    FinishAfterWrites(wire);
  }

  ServiceCore& core_;
  grpc::CallbackServerContext* context_;
  const Clock::time_point start_ = Clock::now();
  CallGuard guard_;
  // Front lane only:
  SessionInput input_;
  SessionFrontEnd front_end_;
  // Compute lane only (and End, once):
  LayerRunner runner_;  // stateless: the layer jobs share it
  std::shared_ptr<const ResolvedPolicy> policy_;
  ModelWideScores buffered_;  // model-wide policies: per-layer scores until finish
  v1::SessionSummary summary_;
  std::string label_ = kNoPolicy;
  std::string request_id_;
  int64_t next_seq_ = 0;  // the next layer job's place in stream order
  // The layer jobs' answers, in stream order:
  std::mutex answer_mutex_;  // guards what follows, summary_ and the metrics' Count
  std::deque<std::optional<LayerOutcome>> outcomes_;  // from answered_seq_ on
  int64_t answered_seq_ = 0;
  // Shared by the lanes:
  const int read_ahead_;
  const int parallel_layers_;
  std::mutex mutex_;  // guards what follows, up to ended_
  std::deque<SessionItem> items_;
  int pending_layers_ = 0;
  bool read_paused_ = false;
  bool read_outstanding_ = false;  // a read started whose message is not yet queued
  bool read_wanted_ = false;       // a read was asked for meanwhile
  int chunks_waiting_ = 0;         // tensor_chunk messages read, not yet copied
  int layers_in_flight_ = 0;       // layer jobs computing
  std::atomic<bool> ended_{false};
  SerialLane front_lane_;
  SerialLane compute_lane_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartCompressSession(
    ServiceCore& core, grpc::CallbackServerContext* context) {
  return new SessionCall(core, context);
}

}  // namespace kvtrim::service
