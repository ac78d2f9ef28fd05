// DeleteModel: removes a model and its file (on the work pool: it touches the disk).
#include <chrono>

#include "service/reactors.h"
#include "service/rpcs.h"

namespace kvtrim::service {

grpc::ServerUnaryReactor* StartDeleteModel(ServiceCore& core, grpc::CallbackServerContext* context,
                                           const v1::DeleteModelRequest* request,
                                           v1::DeleteModelResponse*) {
  const auto start = std::chrono::steady_clock::now();
  auto* call = new UnaryCall(core, CallSlot::kNone, *context);
  core.pool().Post([&core, call, request, start] {
    absl::Status status = call->admitted();
    if (status.ok()) status = core.models().Delete(request->digest());
    core.LogServerError(Rpc::kDeleteModel, "", status);
    core.metrics().RecordRequest(Rpc::kDeleteModel, kNoPolicy, status.code(),
                                 SecondsSince(start));
    call->Finish(ToGrpcStatus(status));
  });
  return call;
}

}  // namespace kvtrim::service
