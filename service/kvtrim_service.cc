#include "service/kvtrim_service.h"

#include "service/rpcs.h"

namespace kvtrim::service {

grpc::ServerUnaryReactor* KvtrimService::ListPolicies(grpc::CallbackServerContext* context,
                                                      const v1::ListPoliciesRequest* request,
                                                      v1::ListPoliciesResponse* response) {
  return StartListPolicies(core_, context, request, response);
}

grpc::ServerUnaryReactor* KvtrimService::Compress(grpc::CallbackServerContext* context,
                                                  const v1::CompressRequest* request,
                                                  v1::CompressResponse* response) {
  return StartCompress(core_, context, request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KvtrimService::CompressSession(
    grpc::CallbackServerContext* context) {
  return StartCompressSession(core_, context);
}

grpc::ServerReadReactor<v1::RegisterModelRequest>* KvtrimService::RegisterModel(
    grpc::CallbackServerContext* context, v1::RegisterModelResponse* response) {
  return StartRegisterModel(core_, context, response);
}

grpc::ServerUnaryReactor* KvtrimService::ListModels(grpc::CallbackServerContext* context,
                                                    const v1::ListModelsRequest* request,
                                                    v1::ListModelsResponse* response) {
  return StartListModels(core_, context, request, response);
}

grpc::ServerUnaryReactor* KvtrimService::DeleteModel(grpc::CallbackServerContext* context,
                                                     const v1::DeleteModelRequest* request,
                                                     v1::DeleteModelResponse* response) {
  return StartDeleteModel(core_, context, request, response);
}

grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>* KvtrimService::Regions(
    grpc::CallbackServerContext* context) {
  return StartRegions(core_, context);
}

grpc::ServerUnaryReactor* KvtrimService::ListRegions(grpc::CallbackServerContext* context,
                                                     const v1::ListRegionsRequest* request,
                                                     v1::ListRegionsResponse* response) {
  return StartListRegions(core_, context, request, response);
}

}  // namespace kvtrim::service
