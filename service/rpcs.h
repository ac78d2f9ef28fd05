// The handlers of kvtrim.v1.Kvtrim, one per RPC (service/rpc_<name>.cc), on the gRPC
// callback API: each starts its reactor; blocking work runs on ServiceCore::pool().
#pragma once

#include <functional>
#include <string>

#include "grpcpp/grpcpp.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "service/service_core.h"

namespace kvtrim::service {

/// ListPolicies: the answer built at start-up.
grpc::ServerUnaryReactor* StartListPolicies(ServiceCore& core, grpc::CallbackServerContext* context,
                                            const v1::ListPoliciesRequest* request,
                                            v1::ListPoliciesResponse* response);

/// Compress: every layer of the request with one policy, answered in request order.
grpc::ServerUnaryReactor* StartCompress(ServiceCore& core, grpc::CallbackServerContext* context,
                                        const v1::CompressRequest* request,
                                        v1::CompressResponse* response);

/// Compress's work after admission, without the call: decode the settings and every layer
/// (regions through `decode`), resolve the policy once, compute the layers (or score them
/// and decide model-wide), encode into `response` (filled only on success), record the
/// metrics. `alive(step)` is asked before decoding and before each layer (the RPC: its
/// deadline and cancellation). Used by StartCompress and the Compress fuzz target.
absl::Status CompressRequestLayers(
    ServiceCore& core, const DecodeContext& decode,
    const std::function<absl::Status(const std::string&)>& alive,
    const v1::CompressRequest& request, v1::CompressResponse* response);

/// CompressSession: begin -> layer* -> finish (see KvtrimService::CompressSession).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartCompressSession(
    ServiceCore& core, grpc::CallbackServerContext* context);

/// RegisterModel: header, then weight chunks; stores the model, answers its digest.
grpc::ServerReadReactor<v1::RegisterModelRequest>* StartRegisterModel(
    ServiceCore& core, grpc::CallbackServerContext* context, v1::RegisterModelResponse* response);

/// ListModels: every registered model in digest order.
grpc::ServerUnaryReactor* StartListModels(ServiceCore& core, grpc::CallbackServerContext* context,
                                          const v1::ListModelsRequest* request,
                                          v1::ListModelsResponse* response);

/// DeleteModel: removes a model and its file.
grpc::ServerUnaryReactor* StartDeleteModel(ServiceCore& core, grpc::CallbackServerContext* context,
                                           const v1::DeleteModelRequest* request,
                                           v1::DeleteModelResponse* response);

/// ListRegions: the zero-copy transports' totals, and the calling lease's regions.
grpc::ServerUnaryReactor* StartListRegions(ServiceCore& core, grpc::CallbackServerContext* context,
                                           const v1::ListRegionsRequest* request,
                                           v1::ListRegionsResponse* response);

/// Regions: the lease stream of the zero-copy transports.
grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>* StartRegions(
    ServiceCore& core, grpc::CallbackServerContext* context);

}  // namespace kvtrim::service
