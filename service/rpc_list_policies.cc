// ListPolicies: answered from the list built at start-up, on gRPC's thread (no blocking).
#include <chrono>

#include "service/reactors.h"
#include "service/rpcs.h"

namespace kvtrim::service {

grpc::ServerUnaryReactor* StartListPolicies(ServiceCore& core, grpc::CallbackServerContext* context,
                                            const v1::ListPoliciesRequest*,
                                            v1::ListPoliciesResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  auto* call = new UnaryCall(core, CallSlot::kNone, *context);
  const absl::Status status = call->admitted();
  if (status.ok()) *response = core.policies();
  core.metrics().RecordRequest(Rpc::kListPolicies, kNoPolicy, status.code(), SecondsSince(start));
  call->Finish(ToGrpcStatus(status));
  return call;
}

}  // namespace kvtrim::service
