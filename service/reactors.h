// Building blocks of the callback-API handlers: a unary call's reactor, the lifetime of a
// reactor shared with pool tasks, and a bidirectional stream with ordered writes.
#pragma once

#include <deque>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "service/service_core.h"
#include "service/status.h"

namespace kvtrim::service {

/// Counts who still uses a reactor: gRPC until OnDone, plus every pool task posted for
/// it. The last Release() tells the owner to delete the reactor. Thread-safe.
class ReactorHolds {
 public:
  /// Taken before posting a task that uses the reactor.
  void Hold() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++holds_;
  }
  /// True for the last release: the reactor may be deleted now.
  bool Release() {
    std::lock_guard<std::mutex> lock(mutex_);
    return --holds_ == 0;
  }

 private:
  std::mutex mutex_;
  int holds_ = 1;  // gRPC's, released in OnDone
};

/// The reactor of a unary call: holds the call's CallGuard (drain and limit accounting)
/// until gRPC is done with the call, then deletes itself. Nothing may touch it after
/// Finish().
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(ServiceCore& core, CallSlot slot, const grpc::ServerContextBase& context)
      : guard_(core, slot, context) {}
  /// OK when the call was admitted (authenticated, not draining, under its limit) or may
  /// wait for a slot (AwaitSlot).
  const absl::Status& admitted() const { return guard_.status(); }
  /// The final admission (CallGuard::AwaitSlot): blocks up to --admission_wait_ms for a
  /// call that found every slot taken. Off gRPC's threads only.
  const absl::Status& AwaitSlot(const grpc::ServerContextBase& context) {
    return guard_.AwaitSlot(context);
  }
  /// The caller's tenant ("" without bearer tokens).
  const std::string& tenant() const { return guard_.tenant(); }
  /// Gives the call's admission slot back before its status goes out (CallGuard), then
  /// finishes the call. Nothing may touch the call afterwards.
  void FinishCall(const grpc::Status& status) {
    guard_.ReleaseSlot();
    Finish(status);
  }
  /// The client cancelled or its deadline passed: the slot goes back at once, although the
  /// work may still be running (the client can open its next call now; CallGuard).
  void OnCancel() override { guard_.ReleaseSlot(); }
  void OnDone() override { delete this; }

 private:
  CallGuard guard_;
};

/// A server bidirectional stream whose writes go out in order, one at a time, from any
/// thread, and whose Finish waits for the queued writes. Reads are started with
/// RequestRead() (one outstanding at a time: the derived class's duty) into `incoming_`.
/// No Start* call follows Finish, and the reactor deletes itself when gRPC is done with
/// it and no pool task holds it (Hold / Release). Derived classes implement OnReadDone.
template <class Request, class Response>
class BidiStream : public grpc::ServerBidiReactor<Request, Response> {
 public:
  /// Queues `response` (dropped once a finish was requested or a write failed).
  void Send(Response response) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finish_requested_ || write_failed_) return;
      queued_.push_back(std::move(response));
      if (!writing_) {
        writing_ = true;
        current_ = std::move(queued_.front());
        queued_.pop_front();
        start = true;
      }
    }
    if (start) this->StartWrite(&current_);
  }

  /// Ends the call with `status` once every queued write is out. Only the first counts.
  void FinishAfterWrites(grpc::Status status) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finish_requested_) return;
      finish_requested_ = true;
      status_ = std::move(status);
    }
    MaybeFinish();
  }

  /// Starts reading the next message into `incoming_`; false (nothing started) once a
  /// finish was requested.
  bool RequestRead() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finish_requested_) return false;
      ++reads_starting_;
    }
    this->StartRead(&incoming_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --reads_starting_;
    }
    MaybeFinish();
    return true;
  }

  /// A pool task will use the reactor: it lives until the matching Release().
  void Hold() { holds_.Hold(); }
  /// The task is done with the reactor.
  void Release() {
    if (holds_.Release()) delete this;
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ok) {
        write_failed_ = true;  // the client is gone: drop the rest
        queued_.clear();
      }
      if (!queued_.empty()) {
        current_ = std::move(queued_.front());
        queued_.pop_front();
        start = true;
      } else {
        writing_ = false;
      }
    }
    if (start) {
      this->StartWrite(&current_);
    } else {
      MaybeFinish();
    }
  }

  void OnDone() override { Release(); }

 protected:
  virtual ~BidiStream() = default;

  Request incoming_;  // the message of the outstanding read

 private:
  /// Calls Finish once a finish was requested and no write or read start is pending.
  void MaybeFinish() {
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!finish_requested_ || finish_called_ || writing_ || reads_starting_ > 0) return;
      finish_called_ = true;
      status = status_;
    }
    this->Finish(status);
  }

  std::mutex mutex_;
  std::deque<Response> queued_;
  Response current_;  // the message of the outstanding write
  bool writing_ = false;
  bool write_failed_ = false;
  int reads_starting_ = 0;
  bool finish_requested_ = false;
  bool finish_called_ = false;
  grpc::Status status_;
  ReactorHolds holds_;
};

}  // namespace kvtrim::service
