// The kvtrim.v1.Kvtrim gRPC service: admission, deadlines, validation, compute, metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <ostream>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "kernels/engine.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "service/metrics.h"
#include "service/model_store.h"
#include "service/region_registry.h"
#include "service/tensor_codec.h"

namespace kvtrim::service {

/// Implements kvtrim.v1.Kvtrim on a PolicyEngine (sync gRPC API; every method may run on
/// several threads at once). Every handler works in absl::Status and converts once, at
/// its end, with ToGrpcStatus. Compress and CompressSession are admitted against
/// `max_inflight`; the engine, backend, metrics, model store and registry are borrowed and
/// must outlive it.
class KvtrimService final : public v1::Kvtrim::Service {
 public:
  /// Request-handling settings (kvtrimd flags).
  struct Options {
    /// --max_inflight (>= 1; lower values are raised to 1): the most Compress +
    /// CompressSession calls served at once.
    int max_inflight = 64;
    /// --numerics: the mode of requests that leave settings.numerics unspecified.
    Numerics default_numerics = Numerics::kFast;
  };

  /// `backend` is the one `engine` computes on (ListPolicies reports its numerics modes per
  /// policy). `models` holds the registered models (RegisterModel / ListModels /
  /// DeleteModel, and the model_digest of compression settings). `error_log` (may be null)
  /// receives one line per call that fails with a server-side error (INTERNAL, UNKNOWN,
  /// DATA_LOSS), with the request's request_id.
  KvtrimService(const PolicyEngine& engine, const Backend& backend, Metrics& metrics,
                ModelStore& models, Options options, std::ostream* error_log = nullptr);

  /// Session and transport settings (kvtrimd flags); set before the server starts.
  struct TransportOptions {
    int64_t max_layer_bytes = int64_t{8} << 30;  // --max_layer_bytes (chunked tensors)
    int session_read_ahead = 2;                   // --session_read_ahead
    size_t host_buffer_pool_bytes = size_t{1} << 30;  // --host_buffer_pool_bytes (0 = none)
  };
  /// Serves region tensors and the Regions RPC from `regions` (borrowed; null = none:
  /// Regions and region tensors are FAILED_PRECONDITION). Set before the server starts.
  void SetTransports(RegionRegistry* regions, TransportOptions options) {
    regions_ = regions;
    transport_options_ = options;
    buffers_ = options.host_buffer_pool_bytes > 0
                   ? std::make_shared<HostBufferPool>(options.host_buffer_pool_bytes)
                   : nullptr;
  }

  /// Lists every preset and composable SCORER+ALLOCATOR pair with its output shapes and
  /// numerics modes (built once, at construction).
  grpc::Status ListPolicies(grpc::ServerContext* context, const v1::ListPoliciesRequest* request,
                            v1::ListPoliciesResponse* response) override;

  /// Compresses every layer of the request with one policy; answers layers in request order.
  grpc::Status Compress(grpc::ServerContext* context, const v1::CompressRequest* request,
                        v1::CompressResponse* response) override;

  /// begin -> layer* -> finish. Per-layer policies answer each layer as soon as it is
  /// computed; `finished` (a SessionSummary) follows the last layer, then status OK.
  /// Protocol errors: `layer` or `finish` before `begin`, or a second `begin` ->
  /// FAILED_PRECONDITION naming that message; a repeated layer_id -> INVALID_ARGUMENT
  /// "layer.layer_id"; the client half-closing without `finish` -> INVALID_ARGUMENT naming
  /// "finish" (layers already answered stand); a cancelled / expired call -> CANCELLED /
  /// DEADLINE_EXCEEDED. begin.num_layers = 0 means unknown: each layer is computed with
  /// num_layers = max(layer_id seen so far) + 1, so PyramidKV's schedule (which depends on
  /// L) is only right when begin.num_layers is set.
  grpc::Status CompressSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream) override;

  /// Header first, then weight chunks (service/model_codec.h has the rules); validates the
  /// model (BuildModel), stores and persists it, answers its digest. Registering content
  /// that is already held answers the same digest and writes nothing. Errors name the field
  /// ("header: ...", "weights[layers.0.w_o].shape: ..."); RESOURCE_EXHAUSTED for
  /// --max_models / --max_model_bytes; CANCELLED / DEADLINE_EXCEEDED between messages.
  grpc::Status RegisterModel(grpc::ServerContext* context,
                             grpc::ServerReader<v1::RegisterModelRequest>* reader,
                             v1::RegisterModelResponse* response) override;
  /// Every registered model (digest, header, weight names) in digest order.
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;
  /// Removes a model and its file. INVALID_ARGUMENT / NOT_FOUND naming `digest`. Requests
  /// already using the model finish with it.
  grpc::Status DeleteModel(grpc::ServerContext* context, const v1::DeleteModelRequest* request,
                           v1::DeleteModelResponse* response) override;

  /// The lease stream of the zero-copy transports (see kvtrim.proto): answers `lease` with
  /// a fresh client id, then one answer per RegisterRegion / UnregisterRegion, each with
  /// its own status; when the stream ends every region of the lease is released. Not
  /// counted against max_inflight, and not waited for by a drain.
  grpc::Status Regions(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::RegionResponse, v1::RegionRequest>* stream)
      override;

  /// The registered models (PreparePolicy resolves settings.model_digest here).
  ModelStore& models() { return models_; }

  /// Called with the status of every layer whose computation failed INTERNAL (a backend
  /// fault, e.g. a CUDA error), from the handler's thread; the server checks there whether
  /// the backend is still healthy. Set it before the server starts; may be empty.
  using BackendFailureHook = std::function<void(const absl::Status&)>;
  void SetBackendFailureHook(BackendFailureHook hook) { backend_failure_hook_ = std::move(hook); }

  /// Calls admitted and not yet finished (Compress + CompressSession).
  int inflight() const { return inflight_.load(); }

  /// Starts draining: new calls of every kvtrim RPC are answered UNAVAILABLE "draining";
  /// calls already running continue. Irreversible.
  void StartDraining();
  /// Blocks until no kvtrim RPC handler is running or `deadline` passes; returns true when
  /// idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline);

 private:
  /// Holds one admission slot for the lifetime of a call (RAII).
  class Admission;
  /// Counts one running handler for WaitIdle; refuses the call while draining (RAII).
  class CallScope;

  absl::Status CompressImpl(grpc::ServerContext* context, const v1::CompressRequest& request,
                            v1::CompressResponse* response);
  absl::Status SessionImpl(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream,
      std::string* policy_label, std::string* request_id);
  /// Reads the whole RegisterModel stream into the store; counts received tensor bytes.
  absl::Status RegisterModelImpl(grpc::ServerContext* context,
                                 grpc::ServerReader<v1::RegisterModelRequest>* reader,
                                 v1::RegisterModelResponse* response, int64_t* bytes);

  /// The call's decoding context: the regions and its kvtrim-client-id metadata.
  DecodeContext MakeDecodeContext(const grpc::ServerContext& context) const;
  /// Counts a decoded layer's tensor bytes per transport.
  void CountTransportBytes(const TransportBytes& bytes);
  /// Publishes the region and lease counts (kvtrim_regions, kvtrim_region_leases).
  void PublishRegionMetrics();
  /// The Regions stream after the checks: the lease and its requests.
  absl::Status RegionsImpl(grpc::ServerReaderWriter<v1::RegionResponse, v1::RegionRequest>* stream);
  /// A session layer's computation failed: observes the time as validation, reports
  /// INTERNAL to the backend-failure hook, returns `status`.
  absl::Status ComputeFailed(const absl::Status& status, double validate_seconds,
                             std::chrono::steady_clock::time_point start);

  /// Logs server-side failures (not client errors) with the request id.
  void LogServerError(Rpc rpc, const std::string& request_id, const absl::Status& status);

  /// Resolves the policy, looks up settings.model_digest (unknown -> FAILED_PRECONDITION
  /// "unknown model digest") and checks what the policy needs from the model
  /// (PolicyEngine::AttachModel). `field` is "settings" or "begin".
  absl::StatusOr<ResolvedPolicy> PreparePolicy(const CompressionSettings& settings,
                                               const std::string& field);

  /// Validates and compresses one layer through the engine; observes the validate and
  /// compute stages.
  absl::StatusOr<LayerDecision> ComputeLayer(const ResolvedPolicy& policy,
                                             const LayerRequest& layer, const std::string& field);

  /// Scores of a model-wide policy buffered between layers (scores only, never K/V; on the
  /// GPU backend they stay in device memory, LayerScores::resident, freed with the entries).
  struct ModelWideScores {
    std::vector<LayerScores> layers;
    std::vector<double> compute_seconds;  // scoring time of each buffered layer
  };
  /// Validates and scores one layer of a model-wide policy into `buffered`.
  absl::Status ScoreForModelWide(const ResolvedPolicy& policy, const LayerRequest& layer,
                                 const std::string& field, ModelWideScores* buffered);
  /// Decides every buffered layer at once on the backend that scored them
  /// (PolicyEngine::DecideModelWide) and empties the buffer, also on failure (INTERNAL goes
  /// to the backend-failure hook).
  absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(const ResolvedPolicy& policy,
                                                             ModelWideScores* buffered);

  /// The `policy` metric label: `name` when the registry resolves it, else "invalid".
  std::string PolicyLabel(const std::string& name) const;

  const PolicyEngine& engine_;
  Metrics& metrics_;
  ModelStore& models_;
  const int max_inflight_;
  const Numerics default_numerics_;
  std::atomic<int> inflight_{0};
  std::mutex calls_mutex_;               // guards active_calls_ and draining_
  std::condition_variable calls_idle_;   // signalled when active_calls_ drops to 0
  int active_calls_ = 0;
  bool draining_ = false;
  std::ostream* error_log_;
  BackendFailureHook backend_failure_hook_;
  RegionRegistry* regions_ = nullptr;
  TransportOptions transport_options_;
  std::shared_ptr<HostBufferPool> buffers_;  // host shm reads, chunks, misaligned copies
  std::mutex log_mutex_;                     // serialises error_log_ lines
  std::set<std::string> policy_names_;       // presets and SCORER+ALLOCATOR compositions
  v1::ListPoliciesResponse policies_;        // the ListPolicies answer, built once
};

/// DEADLINE_EXCEEDED when the call's deadline has passed, CANCELLED when the client
/// cancelled it; `before` names the step that was about to run ("layers[2]").
absl::Status CheckCallAlive(const grpc::ServerContext& context, const std::string& before);

}  // namespace kvtrim::service
