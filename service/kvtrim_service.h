// The kvtrim.v1.Kvtrim gRPC service on the callback API: each RPC's handler lives in its
// own file (service/rpc_<name>.cc, declared in service/rpcs.h) over a shared ServiceCore.
#pragma once

#include <chrono>
#include <ostream>

#include "grpcpp/grpcpp.h"
#include "kernels/engine.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "service/metrics.h"
#include "service/model_store.h"
#include "service/region_registry.h"
#include "service/service_core.h"

namespace kvtrim::service {

/// The generated callback service with CompressSession taking wire bytes (its messages
/// are parsed by the session itself, so that chunk data is copied once): the generated
/// CallbackService, written out with WithRawCallbackMethod_ for that one method.
using KvtrimCallbackBase = v1::Kvtrim::WithCallbackMethod_ListPolicies<
    v1::Kvtrim::WithCallbackMethod_Compress<v1::Kvtrim::WithRawCallbackMethod_CompressSession<
        v1::Kvtrim::WithCallbackMethod_RegisterModel<v1::Kvtrim::WithCallbackMethod_ListModels<
            v1::Kvtrim::WithCallbackMethod_DeleteModel<
                v1::Kvtrim::WithCallbackMethod_Regions<
                    v1::Kvtrim::WithCallbackMethod_ListRegions<v1::Kvtrim::Service>>>>>>>>;

/// Implements kvtrim.v1.Kvtrim (asynchronous: gRPC's callback API). No thread is held by
/// an idle call: a Regions lease or a session waiting for its client costs memory only;
/// blocking work (decoding, compute, model storage) runs on the core's work pool.
/// Compress and CompressSession are admitted against `max_inflight`, Regions leases
/// against `max_leases`. The engine, backend, metrics and model store are borrowed and
/// must outlive it.
class KvtrimService final : public KvtrimCallbackBase {
 public:
  using Options = ServiceOptions;

  /// `backend` is the one `engine` computes on (ListPolicies reports its numerics modes).
  /// `error_log` (may be null) receives one line per call that fails server-side
  /// (INTERNAL, UNKNOWN, DATA_LOSS), with the request's request_id.
  KvtrimService(const PolicyEngine& engine, const Backend& backend, Metrics& metrics,
                ModelStore& models, Options options, std::ostream* error_log = nullptr)
      : core_(engine, backend, metrics, models, options, error_log) {}

  /// Serves region tensors and the Regions RPC from `regions` (borrowed; null = none:
  /// Regions and region tensors are FAILED_PRECONDITION). Set before the server starts.
  void SetTransports(RegionRegistry* regions, TransportOptions options) {
    core_.SetTransports(regions, options);
  }
  /// Called with the status of every layer whose computation failed INTERNAL (a backend
  /// fault, e.g. a CUDA error); the server checks there whether the backend is still
  /// healthy. Set it before the server starts; may be empty.
  void SetBackendFailureHook(ServiceCore::BackendFailureHook hook) {
    core_.SetBackendFailureHook(std::move(hook));
  }

  /// Lists every preset and composable SCORER+ALLOCATOR pair with its output shapes and
  /// numerics modes (built once, at construction).
  grpc::ServerUnaryReactor* ListPolicies(grpc::CallbackServerContext* context,
                                         const v1::ListPoliciesRequest* request,
                                         v1::ListPoliciesResponse* response) override;

  /// Compresses every layer of the request with one policy; answers layers in request order.
  grpc::ServerUnaryReactor* Compress(grpc::CallbackServerContext* context,
                                     const v1::CompressRequest* request,
                                     v1::CompressResponse* response) override;

  /// begin -> layer* -> finish. Per-layer policies answer each layer as soon as it is
  /// computed; `finished` (a SessionSummary) follows the last layer, then status OK.
  /// Protocol errors: `layer` or `finish` before `begin`, or a second `begin` ->
  /// FAILED_PRECONDITION naming that message; a repeated layer_id -> INVALID_ARGUMENT
  /// "layer.layer_id"; the client half-closing without `finish` -> INVALID_ARGUMENT naming
  /// "finish" (layers already answered stand); a cancelled / expired call -> CANCELLED /
  /// DEADLINE_EXCEEDED. Every failure, a backend's included, ends the call with its own
  /// status after a last `error` message carrying it. begin.num_layers = 0 means unknown:
  /// each layer is computed with num_layers = max(layer_id seen so far) + 1, so
  /// PyramidKV's schedule (which depends on L) is only right when begin.num_layers is set.
  /// Requests arrive as SessionRequest wire bytes, replies leave as SessionResponse's; a
  /// message that is not a SessionRequest -> INVALID_ARGUMENT naming "SessionRequest".
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CompressSession(
      grpc::CallbackServerContext* context) override;

  /// Header first, then weight chunks (service/model_codec.h has the rules); validates the
  /// model (BuildModel), stores and persists it, answers its digest. Registering content
  /// that is already held answers the same digest and writes nothing. Errors name the field
  /// ("header: ...", "weights[layers.0.w_o].shape: ..."); RESOURCE_EXHAUSTED for
  /// --max_models / --max_model_bytes; CANCELLED / DEADLINE_EXCEEDED between messages.
  grpc::ServerReadReactor<v1::RegisterModelRequest>* RegisterModel(
      grpc::CallbackServerContext* context, v1::RegisterModelResponse* response) override;
  /// Every registered model (digest, header, weight names) in digest order.
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  /// Removes a model and its file. INVALID_ARGUMENT / NOT_FOUND naming `digest`. Requests
  /// already using the model finish with it.
  grpc::ServerUnaryReactor* DeleteModel(grpc::CallbackServerContext* context,
                                        const v1::DeleteModelRequest* request,
                                        v1::DeleteModelResponse* response) override;

  /// The lease stream of the zero-copy transports (see kvtrim.proto): answers `lease` with
  /// a fresh client id, then one answer per RegisterRegion / UnregisterRegion, each with
  /// its own status; when the stream ends every region of the lease is released. Counted
  /// against max_leases (RESOURCE_EXHAUSTED "max_leases" beyond), not against
  /// max_inflight, and not waited for by a drain.
  grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>* Regions(
      grpc::CallbackServerContext* context) override;
  /// Whether regions are on, every client's leases and regions by kind, and the regions of
  /// the lease named in kvtrim-client-id (NOT_FOUND when it is not open).
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;

  /// The registered models (PreparePolicy resolves settings.model_digest here).
  ModelStore& models() { return core_.models(); }
  /// Calls admitted and not yet finished (Compress + CompressSession).
  int inflight() const { return core_.inflight(); }
  /// Frees the host buffers idle for longer than --host_buffer_idle_s; returns the bytes.
  size_t ExpireIdleBuffers() { return core_.ExpireIdleBuffers(); }
  /// Publishes kvtrim_heap_bytes and kvtrim_host_buffer_bytes.
  void PublishMemoryMetrics() { core_.PublishMemoryMetrics(); }
  /// Calls waiting for a --max_inflight slot (--admission_wait_ms).
  int admission_waiting() const { return core_.admission_waiting(); }
  /// Regions leases held now.
  int leases() const { return core_.leases(); }

  /// Starts draining: new calls of every kvtrim RPC are answered UNAVAILABLE "draining";
  /// calls already running continue. Irreversible.
  void StartDraining() { core_.StartDraining(); }
  /// Blocks until no kvtrim call other than a Regions lease is running, or `deadline`
  /// passes; returns true when idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline) {
    return core_.WaitIdle(deadline);
  }

 private:
  ServiceCore core_;
};

}  // namespace kvtrim::service
