// ListModels: every registered model (digest, header, weight names), in digest order.
#include <chrono>

#include "service/model_codec.h"
#include "service/reactors.h"
#include "service/rpcs.h"

namespace kvtrim::service {

grpc::ServerUnaryReactor* StartListModels(ServiceCore& core, grpc::CallbackServerContext* context,
                                          const v1::ListModelsRequest*,
                                          v1::ListModelsResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  auto* call = new UnaryCall(core, CallSlot::kNone, *context);
  const absl::Status status = call->admitted();
  if (status.ok()) {
    for (const auto& model : core.models().List()) EncodeModelInfo(*model, response->add_models());
  }
  core.metrics().RecordRequest(Rpc::kListModels, kNoPolicy, status.code(), SecondsSince(start));
  call->Finish(ToGrpcStatus(status));
  return call;
}

}  // namespace kvtrim::service
