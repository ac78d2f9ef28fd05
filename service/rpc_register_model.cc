// RegisterModel: a client stream of a header and weight chunks, assembled, validated,
// stored and persisted. Messages are taken on the work pool, one at a time, in order.
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "service/model_codec.h"
#include "service/reactors.h"
#include "service/rpcs.h"

namespace kvtrim::service {

namespace {

/// The reactor of one RegisterModel call. Reads are requested and the call finished from
/// its lane only, so no read starts after Finish.
class RegisterModelCall final : public grpc::ServerReadReactor<v1::RegisterModelRequest> {
 public:
  RegisterModelCall(ServiceCore& core, grpc::CallbackServerContext* context,
                    v1::RegisterModelResponse* response)
      : core_(core),
        context_(context),
        response_(response),
        guard_(core, CallSlot::kNone, *context),
        lane_(core.pool()),
        assembler_(core.models().options().max_model_bytes) {
    if (!guard_.status().ok()) {
      End(guard_.status());
      return;
    }
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    holds_.Hold();
    lane_.Post([this, ok] {
      Take(ok);
      if (holds_.Release()) delete this;
    });
  }

  void OnDone() override {
    if (holds_.Release()) delete this;
  }

 private:
  /// The next message (`ok`) or the end of the stream (client half-close, cancellation or
  /// deadline).
  void Take(bool ok) {
    if (!ok) {
      // The stream also ends when the client cancels or the deadline passes.
      absl::Status status = CheckCallAlive(*context_, "storing the model");
      if (status.ok()) status = Store();
      return End(status);
    }
    ++messages_;
    if (auto st = CheckCallAlive(*context_, absl::StrCat("RegisterModel message #", messages_));
        !st.ok()) {
      return End(st);
    }
    const absl::Status added = assembler_.Add(message_);
    message_.Clear();
    if (!added.ok()) return End(added);
    StartRead(&message_);
  }

  /// Validates the assembled model, stores and persists it, answers its digest.
  absl::Status Store() {
    auto input = assembler_.Finish();
    if (!input.ok()) return input.status();
    // The transfer's share of the registration (the store logs its own steps).
    core_.LogLine(absl::StrCat("kvtrimd: RegisterModel received ", assembler_.received_bytes(),
                               " bytes in ", SecondsSince(start_), " s"));
    auto digest = core_.models().Add(*std::move(input));
    if (!digest.ok()) return digest.status();
    response_->set_digest(*digest);
    return absl::OkStatus();
  }

  /// Records the call and finishes it with `status`.
  void End(const absl::Status& status) {
    if (!status.ok()) response_->Clear();
    core_.metrics().AddRequestBytes(Rpc::kRegisterModel, assembler_.received_bytes());
    core_.LogServerError(Rpc::kRegisterModel, "", status);
    core_.metrics().RecordRequest(Rpc::kRegisterModel, kNoPolicy, status.code(),
                                  SecondsSince(start_));
    Finish(ToGrpcStatus(status));
  }

  ServiceCore& core_;
  grpc::CallbackServerContext* context_;
  v1::RegisterModelResponse* response_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  CallGuard guard_;
  SerialLane lane_;
  ModelAssembler assembler_;
  v1::RegisterModelRequest message_;
  int64_t messages_ = 0;
  ReactorHolds holds_;
};

}  // namespace

grpc::ServerReadReactor<v1::RegisterModelRequest>* StartRegisterModel(
    ServiceCore& core, grpc::CallbackServerContext* context, v1::RegisterModelResponse* response) {
  return new RegisterModelCall(core, context, response);
}

}  // namespace kvtrim::service
