// What every RPC of kvtrim.v1.Kvtrim shares: engine, metrics, models, regions, the work
// pool, call accounting (admission, leases, drain) and the per-call helpers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "kernels/engine.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "service/admission_gate.h"
#include "service/bearer_tokens.h"
#include "service/host_buffer_pool.h"
#include "service/metrics.h"
#include "service/model_store.h"
#include "service/region_registry.h"
#include "service/tensor_codec.h"
#include "service/work_pool.h"

namespace kvtrim::service {

/// Resolves the policy of `settings` on `engine`, looks up settings.model_digest in `models`
/// (ModelStore::FindOrLoad, so a model another kvtrimd wrote to a shared --data_dir loads;
/// unknown -> FAILED_PRECONDITION "<field>.model_digest") and attaches the model
/// (PolicyEngine::AttachModel). Shared by the RPCs and libkvtrim's in-process engine.
absl::StatusOr<ResolvedPolicy> PreparePolicyWithModel(const PolicyEngine& engine,
                                                      ModelStore& models,
                                                      const CompressionSettings& settings,
                                                      const std::string& field);

/// Request-handling settings (kvtrimd flags).
struct ServiceOptions {
  /// --max_inflight (>= 1; lower values are raised to 1): the most Compress +
  /// CompressSession calls served at once.
  int max_inflight = 64;
  /// --max_leases (>= 1): the most Regions leases (open Regions streams) held at once.
  int max_leases = 1024;
  /// --admission_wait_ms: how long a Compress / CompressSession call arriving with every
  /// --max_inflight slot taken waits for one before it is refused (0: refused at once). At
  /// most max_inflight calls wait at once; more are refused at once.
  std::chrono::milliseconds admission_wait{200};
  /// --numerics: the mode of requests that leave settings.numerics unspecified.
  Numerics default_numerics = Numerics::kFast;
  /// --auth_tokens_file: every kvtrim.v1 call must carry a listed bearer token, and its
  /// tenant scopes the call's leases and regions (null: no tokens, one anonymous tenant).
  std::shared_ptr<const BearerTokens> tokens;
};

/// Session and transport settings (kvtrimd flags).
struct TransportOptions {
  int64_t max_layer_bytes = int64_t{8} << 30;  // --max_layer_bytes (chunked, host shm reads)
  int session_read_ahead = 2;                        // --session_read_ahead
  int session_parallel_layers = 2;                   // --session_parallel_layers
  size_t host_buffer_pool_bytes = size_t{1} << 30;  // --host_buffer_pool_bytes (0 = none)
  /// --host_buffer_idle_s: pooled buffers idle longer are freed (ExpireIdleBuffers; 0 = kept).
  std::chrono::seconds host_buffer_idle{30};
  /// Page-locks the pool's buffers for the devices (empty: none are), within
  /// max_pinned_buffer_bytes (--max_pinned_buffer_bytes).
  HostMemoryLocker buffer_locker;
  size_t max_pinned_buffer_bytes = 0;
};

/// Which limit a call counts against (CallGuard).
enum class CallSlot {
  kNone,      // ListPolicies, RegisterModel, ListModels, DeleteModel: waited for by a drain
  kInflight,  // Compress, CompressSession: --max_inflight, waited for by a drain
  kLease,     // Regions: --max_leases, not waited for by a drain (the client holds it open)
};

/// The state shared by the RPC handlers (service/rpc_*.cc). The engine, metrics, models
/// and registry are borrowed and must outlive it. Thread-safe.
class ServiceCore {
 public:
  /// `backend` is the one `engine` computes on (ListPolicies reports its numerics modes).
  /// `error_log` (may be null) receives one line per call failing server-side.
  ServiceCore(const PolicyEngine& engine, const Backend& backend, Metrics& metrics,
              ModelStore& models, ServiceOptions options, std::ostream* error_log);

  /// Serves region tensors and Regions from `regions` (null: FAILED_PRECONDITION).
  void SetTransports(RegionRegistry* regions, TransportOptions options);
  /// Called with every INTERNAL failure of a layer's computation (may be empty).
  using BackendFailureHook = std::function<void(const absl::Status&)>;
  void SetBackendFailureHook(BackendFailureHook hook) { backend_failure_hook_ = std::move(hook); }

  const PolicyEngine& engine() const { return engine_; }
  Metrics& metrics() { return metrics_; }
  ModelStore& models() { return models_; }
  RegionRegistry* regions() { return regions_; }
  const TransportOptions& transport_options() const { return transport_options_; }
  Numerics default_numerics() const { return options_.default_numerics; }
  /// The ListPolicies answer, built once.
  const v1::ListPoliciesResponse& policies() const { return policies_; }
  /// Where blocking work runs (never on gRPC's callback threads).
  WorkPool& pool() { return *pool_; }

  /// The `policy` metric label: `name` when the registry resolves it, else "invalid".
  std::string PolicyLabel(const std::string& name) const;
  /// Logs server-side failures (INTERNAL, UNKNOWN, DATA_LOSS) with the request id.
  void LogServerError(Rpc rpc, const std::string& request_id, const absl::Status& status);
  /// Writes one informational line to the error log (when there is one).
  void LogLine(const std::string& line);
  /// Reports an INTERNAL computation failure to the backend-failure hook.
  void ReportBackendFailure(const absl::Status& status);

  /// Resolves the policy, looks up settings.model_digest (unknown -> FAILED_PRECONDITION
  /// "<field>.model_digest") and attaches the model (PolicyEngine::AttachModel).
  absl::StatusOr<ResolvedPolicy> PreparePolicy(const CompressionSettings& settings,
                                               const std::string& field);
  /// The call's kvtrim-client-id metadata scoped to its `tenant` (TenantScopedId); "" when
  /// the call sends none.
  static std::string ScopedClientId(const grpc::ServerContextBase& context,
                                    const std::string& tenant);
  /// The call's decoding context: the regions, buffers and kvtrim-client-id metadata (the
  /// lease id scoped to the call's `tenant`, see TenantScopedId).
  DecodeContext MakeDecodeContext(const grpc::ServerContextBase& context,
                                  const std::string& tenant) const;
  /// Counts a decoded layer's tensor bytes per transport.
  void CountTransportBytes(const TransportBytes& bytes);
  /// Publishes the region and lease counts (kvtrim_regions, kvtrim_region_leases).
  void PublishRegionMetrics();
  /// Frees the host buffers idle for longer than --host_buffer_idle_s; returns the bytes.
  size_t ExpireIdleBuffers();
  /// Publishes the malloc heap's figures and the host buffer pool's (kvtrim_heap_bytes,
  /// kvtrim_host_buffer_bytes).
  void PublishMemoryMetrics();

  /// Calls admitted and not yet finished (Compress + CompressSession).
  int inflight() const { return inflight_.in_use(); }
  /// Calls waiting for a --max_inflight slot now.
  int admission_waiting() const { return inflight_.waiting(); }
  /// Leases (Regions streams) held now.
  int leases() const { return leases_.in_use(); }
  /// New calls of every RPC are refused UNAVAILABLE "draining" from now on. Irreversible.
  void StartDraining();
  /// Blocks until no call that a drain waits for is running, or `deadline`; true if idle.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline);

 private:
  friend class CallGuard;

  const PolicyEngine& engine_;
  Metrics& metrics_;
  ModelStore& models_;
  const ServiceOptions options_;
  std::ostream* error_log_;
  BackendFailureHook backend_failure_hook_;
  RegionRegistry* regions_ = nullptr;
  TransportOptions transport_options_;
  std::shared_ptr<HostBufferPool> buffers_;  // host shm reads, chunks, misaligned copies
  AdmissionGate inflight_;  // --max_inflight; waiters for --admission_wait_ms
  AdmissionGate leases_;    // --max_leases; no waiting
  std::mutex calls_mutex_;              // guards active_calls_ and draining_
  std::condition_variable calls_idle_;  // signalled when active_calls_ drops to 0
  int active_calls_ = 0;
  bool draining_ = false;
  std::mutex log_mutex_;                // serialises error_log_ lines
  std::set<std::string> policy_names_;  // presets and SCORER+ALLOCATOR compositions
  v1::ListPoliciesResponse policies_;
  // Last: destroyed first, it finishes every queued task while the rest still lives.
  std::unique_ptr<WorkPool> pool_;
};

/// One call's hold on the service, from its start to its end (RAII): authenticated when
/// kvtrimd has bearer tokens (UNAUTHENTICATED), refused while draining (UNAVAILABLE), then
/// counted against the limit of its slot (RESOURCE_EXHAUSTED naming max_inflight /
/// max_leases); calls of kNone and kInflight are waited for by a drain.
class CallGuard {
 public:
  /// `context`: the call's, whose `authorization` metadata names its tenant.
  CallGuard(ServiceCore& core, CallSlot slot, const grpc::ServerContextBase& context);
  ~CallGuard();
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

  /// OK when the call may proceed (or, for a kInflight call that found every slot taken,
  /// wait for one: AwaitSlot), else why not.
  const absl::Status& status() const { return status_; }
  /// A kInflight call's admission, final: OK once it holds a slot. One that found every slot
  /// taken waits here up to --admission_wait_ms (blocking: call it off gRPC's threads) and
  /// gets RESOURCE_EXHAUSTED "max_inflight" if none came free, or CANCELLED / DEADLINE_
  /// EXCEEDED when its client gave up meanwhile. Records the wait (stage "admission").
  /// Other calls: status(). Call once, before the call's work.
  const absl::Status& AwaitSlot(const grpc::ServerContextBase& context);
  /// True from the construction of a kInflight call that found every slot taken and may
  /// wait for one, until its AwaitSlot.
  bool must_wait() const { return waiting_; }
  /// The caller's tenant ("" without bearer tokens).
  const std::string& tenant() const { return tenant_; }
  /// Gives the call's --max_inflight / --max_leases slot back now, as its final status is
  /// handed to gRPC or when the client cancels: a client that sends its next call as soon
  /// as it has the answer (or has given up) must find the slot free (gRPC destroys the
  /// reactor, and with it this guard, only later; a cancelled call's work may still be
  /// finishing its current step). The call still counts for a drain until the guard is
  /// destroyed. Idempotent and thread-safe.
  void ReleaseSlot();

 private:
  ServiceCore& core_;
  CallSlot slot_;
  bool counted_ = false;   // in active_calls_
  bool waiting_ = false;   // a waiter of inflight_ until AwaitSlot
  std::atomic<bool> admitted_{false};  // holds a slot of its limit
  std::chrono::steady_clock::time_point arrived_ = std::chrono::steady_clock::now();
  absl::Status status_;
  std::string tenant_;
};

/// DEADLINE_EXCEEDED when the call's deadline has passed, CANCELLED when the client
/// cancelled it; `before` names the step that was about to run ("layers[2]").
absl::Status CheckCallAlive(const grpc::ServerContextBase& context, const std::string& before);

/// Seconds from `start` to now (steady clock).
double SecondsSince(std::chrono::steady_clock::time_point start);

}  // namespace kvtrim::service
