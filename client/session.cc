#include "client/session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_status.h"

namespace kvtrim {

absl::StatusOr<std::unique_ptr<Session>> Session::Open(v1::Kvtrim::StubInterface* stub,
                                                       const v1::CompressionSettings& settings,
                                                       absl::Duration deadline) {
  std::unique_ptr<Session> session(new Session());
  session->context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  session->stream_ = stub->CompressSession(&session->context_);
  Session* raw = session.get();
  session->reader_ = std::thread([raw] { raw->ReadLoop(); });

  v1::SessionRequest begin;
  *begin.mutable_begin() = settings;
  if (!session->stream_->Write(begin)) {
    absl::Status status = session->CloseStream();
    if (!status.ok()) return status;
    return absl::InternalError("CompressSession: stream closed before `begin` was sent");
  }
  return session;
}

Session::~Session() {
  if (!closed_) {
    context_.TryCancel();
    CloseStream().IgnoreError();
  }
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
        result_.layers.push_back(std::move(*response.mutable_layer()));
        break;
      }
      case v1::SessionResponse::kFinished:
        result_.summary = response.finished();
        have_summary_ = true;
        break;
      default:
        protocol_error_ = "CompressSession: a reply carried neither `layer` nor `finished`";
        break;
    }
  }
}

absl::Status Session::CloseStream() {
  if (closed_) return final_status_;
  closed_ = true;
  if (reader_.joinable()) reader_.join();
  final_status_ = FromGrpcStatus(stream_->Finish());
  return final_status_;
}

absl::Status Session::SendLayer(v1::LayerInput layer) {
  if (finished_) return absl::FailedPreconditionError("SendLayer: the session is finished");
  if (closed_) return final_status_;
  const int32_t id = layer.layer_id();
  {
    absl::MutexLock lock(&mu_);
    sent_at_[id] = absl::Now();
  }
  v1::SessionRequest request;
  request.mutable_layer()->Swap(&layer);
  if (stream_->Write(request)) return absl::OkStatus();
  absl::Status status = CloseStream();
  if (!status.ok()) return status;
  return absl::InternalError(
      absl::StrCat("CompressSession: the server closed the stream before layer ", id,
                   " was sent"));
}

absl::StatusOr<SessionResult> Session::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish: the session is finished");
  if (!closed_) {
    v1::SessionRequest request;
    request.mutable_finish();
    if (stream_->Write(request)) stream_->WritesDone();
  }
  absl::Status status = CloseStream();
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
