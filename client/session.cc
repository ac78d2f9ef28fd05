#include "client/session.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/chunk_framing.h"
#include "client/grpc_status.h"
#include "client/regions.h"

namespace kvtrim {

bool IsUnknownModelDigest(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(status.message(), "unknown model digest");
}

namespace {

/// The method path of CompressSession, from the generated service's name (the session
/// opens its stream itself, with wire bytes as the request type).
const char* CompressSessionMethod() {
  static const std::string* const kPath =
      new std::string(absl::StrCat("/", v1::Kvtrim::service_full_name(), "/CompressSession"));
  return kPath->c_str();
}

/// The slot of each LayerTensorBytes span, in sending order.
constexpr v1::TensorSlot kSlots[3] = {v1::TENSOR_SLOT_KEYS, v1::TENSOR_SLOT_VALUES,
                                      v1::TENSOR_SLOT_QUERIES};

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Open(std::shared_ptr<grpc::Channel> channel,
                                                       const v1::CompressionSettings& settings,
                                                       absl::Duration deadline,
                                                       SessionRetry retry) {
  SessionOptions options;
  options.deadline = deadline;
  options.retry = std::move(retry);
  return Open(std::move(channel), settings, std::move(options));
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(std::shared_ptr<grpc::Channel> channel,
                                                       const v1::CompressionSettings& settings,
                                                       SessionOptions options) {
  std::unique_ptr<Session> session(new Session());
  session->channel_ = std::move(channel);
  *session->begin_.mutable_begin() = settings;
  session->deadline_ = absl::Now() + options.deadline;
  session->retry_ = std::move(options.retry);
  session->chunk_bytes_ = options.chunk_bytes;
  session->client_id_ = std::move(options.client_id);
  session->authorization_ = std::move(options.authorization);
  if (!session->StartStream()) {
    absl::Status status = session->CloseStream();
    if (status.ok()) {
      return absl::InternalError("CompressSession: stream closed before `begin` was sent");
    }
    KVTRIM_RETURN_IF_ERROR(session->RecoverOnce(status));
  }
  return session;
}

Session::~Session() {
  if (!closed_) {
    context_->TryCancel();
    CloseStream().IgnoreError();
  }
}

bool Session::StartStream() {
  stream_.reset();  // the previous stream (if any) before its context
  context_ = std::make_unique<grpc::ClientContext>();
  context_->set_deadline(absl::ToChronoTime(deadline_));
  if (!client_id_.empty()) context_->AddMetadata(kClientIdMetadataKey, client_id_);
  if (!authorization_.empty()) context_->AddMetadata(kAuthorizationMetadataKey, authorization_);
  {
    absl::MutexLock lock(&mu_);
    reader_done_ = false;
  }
  const grpc::internal::RpcMethod method(
      CompressSessionMethod(), grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
  stream_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::SessionResponse>::
                    Create(channel_.get(), method, context_.get()));
  closed_ = false;
  reader_ = std::thread([this] { ReadLoop(); });
  return stream_->Write(SerializeToByteBuffer(begin_));
}

void Session::ReadLoop() {
  v1::SessionResponse response;
  while (stream_->Read(&response)) {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    if (have_summary_) {
      protocol_error_ = "CompressSession: a reply arrived after the summary";
      continue;
    }
    switch (response.message_case()) {
      case v1::SessionResponse::kLayer: {
        const int32_t id = response.layer().layer_id();
        auto sent = sent_at_.find(id);
        if (sent != sent_at_.end()) {
          result_.round_trip_seconds[id] = absl::ToDoubleSeconds(now - sent->second);
        }
        answered_ids_.insert(id);
        result_.layers.push_back(std::move(*response.mutable_layer()));
        answered_ = true;
        break;
      }
      case v1::SessionResponse::kFinished:
        result_.summary = response.finished();
        have_summary_ = true;
        answered_ = true;
        break;
      case v1::SessionResponse::kError: {
        // The session failed; kvtrimd may have had to cancel the call itself to stop reading,
        // so this code, not the call's, is the session's status.
        const int32_t code = response.error().code();
        const bool known =
            code > 0 && code <= static_cast<int32_t>(grpc::StatusCode::UNAUTHENTICATED);
        server_error_ = FromGrpcStatus(grpc::Status(
            known ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN,
            response.error().message()));
        break;
      }
      default:
        protocol_error_ =
            "CompressSession: a reply carried neither `layer`, `finished` nor `error`";
        break;
    }
  }
  absl::MutexLock lock(&mu_);
  reader_done_ = true;
}

absl::Status Session::CloseStream() {
  if (closed_) return final_status_;
  closed_ = true;
  if (reader_.joinable()) reader_.join();
  final_status_ = FromGrpcStatus(stream_->Finish());
  absl::MutexLock lock(&mu_);
  if (!server_error_.ok()) final_status_ = server_error_;
  return final_status_;
}

void Session::DisarmRetry() {
  retry_.reregister = nullptr;
  replay_.clear();
  replay_.shrink_to_fit();
  replay_bytes_ = 0;
}

absl::Status Session::RecoverOnce(const absl::Status& status) {
  if (!retry_.reregister || !IsUnknownModelDigest(status)) return status;
  {
    absl::MutexLock lock(&mu_);
    if (answered_) return status;  // layers were answered: replaying would answer them twice
  }
  const std::function<absl::Status()> reregister = std::move(retry_.reregister);
  std::vector<ReplayMessage> replay = std::move(replay_);
  DisarmRetry();  // once only
  if (absl::Status registered = reregister(); !registered.ok()) {
    return absl::Status(registered.code(),
                        absl::StrCat("re-registering the model after \"", status.message(),
                                     "\" failed: ", registered.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    result_ = SessionResult();
    answered_ids_.clear();
    have_summary_ = false;
    protocol_error_.clear();
    server_error_ = absl::OkStatus();
  }
  bool written = StartStream();
  for (size_t i = 0; written && i < replay.size(); ++i) {
    if (replay[i].is_layer) {  // not for the layer's tensor_chunk messages
      absl::MutexLock lock(&mu_);
      sent_at_[replay[i].layer_id] = absl::Now();
    }
    written = stream_->Write(replay[i].bytes);
  }
  if (written) return absl::OkStatus();
  absl::Status closed = CloseStream();
  return closed.ok() ? absl::InternalError("CompressSession: the server closed the replayed "
                                           "stream before every layer was sent")
                     : closed;
}

absl::Status Session::SendLayer(v1::LayerInput layer) {
  // Large inline tensors leave the message and go as chunks framed from these strings.
  std::string taken[3];
  LayerTensorBytes bytes;
  absl::Span<const char>* spans[3] = {&bytes.keys, &bytes.values, &bytes.queries};
  v1::Tensor* tensors[3] = {layer.has_keys() ? layer.mutable_keys() : nullptr,
                            layer.has_values() ? layer.mutable_values() : nullptr,
                            layer.has_queries() ? layer.mutable_queries() : nullptr};
  for (int slot = 0; slot < 3 && chunk_bytes_ > 0; ++slot) {
    v1::Tensor* tensor = tensors[slot];
    if (tensor == nullptr || tensor->data_case() != v1::Tensor::kInlineData) continue;
    if (static_cast<int64_t>(tensor->inline_data().size()) <= chunk_bytes_) continue;
    taken[slot] = std::move(*tensor->mutable_inline_data());
    tensor->clear_inline_data();
    *spans[slot] = absl::MakeConstSpan(taken[slot]);
  }
  return WriteLayer(std::move(layer), bytes);
}

absl::Status Session::SendLayer(v1::LayerInput layer, const LayerTensorBytes& bytes) {
  const absl::Span<const char>* spans[3] = {&bytes.keys, &bytes.values, &bytes.queries};
  const v1::Tensor* tensors[3] = {layer.has_keys() ? &layer.keys() : nullptr,
                                  layer.has_values() ? &layer.values() : nullptr,
                                  layer.has_queries() ? &layer.queries() : nullptr};
  static const char* const kNames[3] = {"keys", "values", "queries"};
  for (int slot = 0; slot < 3; ++slot) {
    if (spans[slot]->empty()) continue;
    if (tensors[slot] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SendLayer: ", spans[slot]->size(), " bytes given for layer.", kNames[slot],
          ", but the layer has no ", kNames[slot], " tensor (set its shape and dtype)"));
    }
    if (tensors[slot]->data_case() != v1::Tensor::DATA_NOT_SET &&
        tensors[slot]->data_case() != v1::Tensor::kChunked) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SendLayer: bytes given for layer.", kNames[slot],
          ", which already names its data; leave its data unset"));
    }
  }
  return WriteLayer(std::move(layer), bytes);
}

absl::Status Session::WriteLayer(v1::LayerInput layer, const LayerTensorBytes& bytes) {
  if (finished_) return absl::FailedPreconditionError("SendLayer: the session is finished");
  if (closed_) return final_status_;
  const int32_t id = layer.layer_id();
  bool answered = false;
  {
    absl::MutexLock lock(&mu_);
    sent_at_[id] = absl::Now();
    answered = answered_;
  }
  if (answered && retry_.reregister) DisarmRetry();
  const absl::Span<const char>* spans[3] = {&bytes.keys, &bytes.values, &bytes.queries};
  if (!bytes.keys.empty()) {
    layer.mutable_keys()->mutable_chunked()->set_total_bytes(bytes.keys.size());
  }
  if (!bytes.values.empty()) {
    layer.mutable_values()->mutable_chunked()->set_total_bytes(bytes.values.size());
  }
  if (!bytes.queries.empty()) {
    layer.mutable_queries()->mutable_chunked()->set_total_bytes(bytes.queries.size());
  }
  // Each chunk's data is copied once, straight into its message's send buffer; a replay
  // keeps the same buffers (reference counted).
  std::vector<ReplayMessage> sent;
  {
    v1::SessionRequest message;
    message.mutable_layer()->Swap(&layer);
    sent.push_back({SerializeToByteBuffer(message), true, id});
  }
  bool written = stream_->Write(sent.back().bytes);
  const size_t step =
      static_cast<size_t>(chunk_bytes_ > 0 ? chunk_bytes_ : kDefaultChunkBytes);
  const bool keep = static_cast<bool>(retry_.reregister);
  // With a replay armed, every chunk is framed even past a failed write: the replay holds
  // whole layers.
  for (int slot = 0; slot < 3 && (written || keep); ++slot) {
    const absl::Span<const char> data = *spans[slot];
    for (size_t offset = 0; offset < data.size() && (written || keep); offset += step) {
      const size_t size = std::min(step, data.size() - offset);
      grpc::ByteBuffer chunk =
          FrameTensorChunk(id, kSlots[slot], offset, data.data() + offset, size);
      if (written) written = stream_->Write(chunk);
      if (keep) sent.push_back({std::move(chunk), false, id});
    }
  }
  if (retry_.reregister) {
    // The replay holds whole layers: all of this layer's messages, or (past the cap)
    // nothing at all.
    for (const ReplayMessage& message : sent) {
      replay_bytes_ += static_cast<int64_t>(message.bytes.Length());
    }
    if (replay_bytes_ > retry_.max_replay_bytes) {
      DisarmRetry();
    } else {
      for (ReplayMessage& message : sent) replay_.push_back(std::move(message));
    }
  }
  if (written) return absl::OkStatus();
  absl::Status status = CloseStream();
  if (!status.ok()) return RecoverOnce(status);
  return absl::InternalError(
      absl::StrCat("CompressSession: the server closed the stream before layer ", id,
                   " was sent"));
}

absl::Status Session::WaitForAnswer(int32_t layer_id) {
  if (finished_) return absl::FailedPreconditionError("WaitForAnswer: the session is finished");
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, layer_id]() {  // runs with mu_ held
        return reader_done_ || answered_ids_.count(layer_id) > 0;
      };
      mu_.Await(absl::Condition(&ready));
      if (answered_ids_.count(layer_id) > 0) return absl::OkStatus();
    }
    // The reads ended without the answer: the stream failed (or ended early).
    if (closed_) {
      if (!final_status_.ok()) return final_status_;
      return absl::InternalError(absl::StrCat(
          "CompressSession: the stream ended before layer ", layer_id, " was answered"));
    }
    absl::Status status = CloseStream();
    if (status.ok()) continue;  // reported as INTERNAL above
    status = RecoverOnce(status);
    if (!status.ok()) return status;  // else the layers were replayed: wait again
  }
}

absl::StatusOr<v1::LayerResult> Session::Answer(int32_t layer_id) {
  KVTRIM_RETURN_IF_ERROR(WaitForAnswer(layer_id));
  absl::MutexLock lock(&mu_);
  for (auto it = result_.layers.rbegin(); it != result_.layers.rend(); ++it) {
    if (it->layer_id() == layer_id) return *it;
  }
  return absl::InternalError(absl::StrCat("CompressSession: layer ", layer_id,
                                          " was answered but its result is missing"));
}

absl::StatusOr<SessionResult> Session::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish: the session is finished");
  auto finish_stream = [this] {
    if (!closed_) {
      v1::SessionRequest request;
      request.mutable_finish();
      if (stream_->Write(SerializeToByteBuffer(request))) stream_->WritesDone();
    }
    return CloseStream();
  };
  absl::Status status = finish_stream();
  if (!status.ok()) {
    status = RecoverOnce(status);
    if (status.ok()) status = finish_stream();
  }
  if (!status.ok()) return status;
  finished_ = true;
  absl::MutexLock lock(&mu_);
  if (!protocol_error_.empty()) return absl::InternalError(protocol_error_);
  if (!have_summary_) {
    return absl::InternalError("CompressSession: the stream ended without a summary");
  }
  return std::move(result_);
}

}  // namespace kvtrim
