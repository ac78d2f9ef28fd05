// Every Prometheus metric kvtrimd exports, owned by one class (design convention 6).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/layer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvtrim::service {

/// The RPCs of kvtrim.v1.Kvtrim (the `rpc` label).
enum class Rpc { kListPolicies, kCompress, kCompressSession, kRegisterModel, kListModels,
                 kDeleteModel, kRegions, kListRegions };
/// How many Rpc values there are.
inline constexpr size_t kRpcCount = static_cast<size_t>(Rpc::kListRegions) + 1;

/// How tensor bytes reached kvtrimd (the `transport` label).
enum class Transport { kInline, kHostShm, kCudaIpc };
/// Label value of `transport` ("inline", "host_shm", "cuda_ipc").
const char* TransportName(Transport transport);
/// Method name of `rpc` as the `rpc` label spells it ("Compress").
const char* RpcName(Rpc rpc);

/// The stages of a compression request (the `stage` label).
enum class Stage {
  kDecode,    // proto -> kernel views and settings, proto-level checks
  kValidate,  // policy resolution, service checks and the engine's per-layer validation
  kCompute,   // backend scoring, allocation, selection (LayerDecision::compute_seconds)
  kEncode,    // kernel decision -> proto response
  kAdmission,  // waiting for a --max_inflight slot (per call; 0 when one was free at once)
  kQueue,      // GPU backend, per layer: waiting for a free device worker (LayerProfile's
               // worker_wait), not counted in kCompute
};
/// How many Stage values there are.
inline constexpr size_t kStageCount = static_cast<size_t>(Stage::kQueue) + 1;
/// Lower-case label value of `stage` ("decode").
const char* StageName(Stage stage);
/// The `model` label value of a model digest: "sha256:" and its first 12 hex digits.
std::string ModelLabel(const std::string& digest);

/// `policy` label value for calls that carry no policy (ListPolicies, model RPCs, sessions
/// that end before `begin`).
inline constexpr char kNoPolicy[] = "none";
/// `policy` label value for a policy name the registry does not resolve.
inline constexpr char kInvalidPolicy[] = "invalid";

/// Owns the registry and every metric family, created once at start-up. Label values are
/// bounded: rpc and stage from the enums above, code from the canonical status codes,
/// policy from the policy registry's names (or kNoPolicy / kInvalidPolicy), which the
/// caller guarantees. Thread-safe.
class Metrics {
 public:
  /// Creates the families and the fixed series; sets kvtrim_build_info{version, git_commit,
  /// backend}=1 (git_commit: the build's, version/build_version.h).
  /// `presets` are pre-created so that their per-policy series exist at zero.
  Metrics(const std::string& version, const std::string& backend,
          const std::vector<std::string>& presets);

  /// The registry to expose (prometheus::Exposer) or to Collect() in tests.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  /// Counts one finished call (kvtrim_requests_total) and its duration
  /// (kvtrim_request_duration_seconds).
  void RecordRequest(Rpc rpc, const std::string& policy, absl::StatusCode code, double seconds);
  /// Observes `seconds` spent in `stage` (kvtrim_stage_duration_seconds).
  void ObserveStage(Stage stage, double seconds);
  /// Counts one answered layer: kvtrim_layers_total{policy, numerics} (the mode that
  /// computed it, "fast" / "exact"), kvtrim_tokens_in_total (H_kv * n),
  /// kvtrim_tokens_kept_total, one kvtrim_kept_ratio observation per head and one
  /// kvtrim_perturbation_ratio{policy, rows} observation per head when perturbation was
  /// computed (rows "all" or "sampled": LayerDecision::perturbation_sampled), and
  /// kvtrim_device_layers_total{device} (LayerDecision::device: a CUDA ordinal or "cpu");
  /// with a `model_digest` (the request's registered model), kvtrim_model_layers_total{model}.
  void RecordLayer(const std::string& policy, const LayerDecision& decision,
                   const std::string& model_digest = "");
  /// At most this many distinct `model` label values (--max_models; default 64); models
  /// beyond it are counted under model="other".
  void SetModelLabelLimit(size_t models);
  /// Adds received tensor bytes (kvtrim_request_bytes_total).
  void AddRequestBytes(Rpc rpc, int64_t bytes);
  /// Tracks admitted calls (kvtrim_inflight_requests).
  void InflightChanged(int delta);
  /// Adds tensor bytes read through `transport` (kvtrim_tensor_bytes_total): inline bytes
  /// and chunks as received, shm bytes as read, CUDA IPC bytes as read in place.
  void AddTransportBytes(Transport transport, int64_t bytes);
  /// Sets the registered regions per kind (kvtrim_regions{kind}: "host_shm", "cuda_ipc",
  /// "cuda_ipc_event") and the open leases (kvtrim_region_leases).
  void SetRegions(int64_t host_shm, int64_t cuda_ipc, int64_t cuda_ipc_event, int64_t leases,
                  uint64_t pinned_shm_bytes);
  /// Sets kvtrim_pinned_buffer_bytes: kvtrimd's pooled host buffers page-locked now.
  void SetPinnedBufferBytes(uint64_t bytes);
  /// Sets kvtrim_heap_bytes{state}: bytes malloc has allocated in its arenas ("in_use"),
  /// keeps free in them ("free") and has mapped for large allocations ("mmapped").
  void SetHeapBytes(uint64_t in_use, uint64_t free, uint64_t mmapped);
  /// Sets kvtrim_host_buffer_bytes{state}: the pooled host buffers idle in the pool and
  /// handed out to calls.
  void SetHostBufferBytes(uint64_t idle, uint64_t in_use);

 private:
  /// The per-policy series of one policy label value.
  struct PolicySeries {
    std::array<prometheus::Counter*, 2> layers{};  // by numerics: fast, exact
    prometheus::Counter* tokens_in = nullptr;
    prometheus::Counter* tokens_kept = nullptr;
    prometheus::Histogram* kept_ratio = nullptr;
    std::array<prometheus::Histogram*, 2> perturbation{};  // by rows: all, sampled
  };
  PolicySeries& SeriesFor(const std::string& policy);
  /// kvtrim_device_layers_total{device} of a CUDA ordinal (-1: "cpu"); bounded by the
  /// devices the backend serves.
  prometheus::Counter& DeviceCounter(int32_t device);
  /// kvtrim_model_layers_total{model} of a model digest (ModelLabel), or of "other" past the
  /// label limit.
  prometheus::Counter& ModelCounter(const std::string& digest);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& stage_duration_;
  prometheus::Family<prometheus::Counter>& layers_;
  prometheus::Family<prometheus::Counter>& tokens_in_;
  prometheus::Family<prometheus::Counter>& tokens_kept_;
  prometheus::Family<prometheus::Histogram>& kept_ratio_;
  prometheus::Family<prometheus::Histogram>& perturbation_;
  prometheus::Family<prometheus::Counter>& request_bytes_;
  prometheus::Family<prometheus::Gauge>& inflight_family_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Family<prometheus::Counter>& transport_bytes_;
  prometheus::Family<prometheus::Gauge>& regions_;
  prometheus::Family<prometheus::Gauge>& leases_family_;
  prometheus::Family<prometheus::Gauge>& pinned_family_;
  prometheus::Family<prometheus::Gauge>& pinned_buffer_family_;
  prometheus::Family<prometheus::Gauge>& heap_family_;
  prometheus::Family<prometheus::Gauge>& host_buffer_family_;
  prometheus::Family<prometheus::Counter>& device_layers_;
  prometheus::Family<prometheus::Counter>& model_layers_;

  std::array<prometheus::Histogram*, kRpcCount> rpc_duration_{};  // by Rpc
  std::array<prometheus::Counter*, kRpcCount> rpc_bytes_{};       // by Rpc
  std::array<prometheus::Counter*, 3> transport_{};        // by Transport
  std::array<prometheus::Gauge*, 3> region_kinds_{};       // host_shm, cuda_ipc, cuda_ipc_event
  prometheus::Gauge* leases_ = nullptr;
  prometheus::Gauge* pinned_shm_bytes_ = nullptr;
  prometheus::Gauge* pinned_buffer_bytes_ = nullptr;
  std::array<prometheus::Gauge*, 3> heap_bytes_{};         // in_use, free, mmapped
  std::array<prometheus::Gauge*, 2> host_buffer_bytes_{};  // idle, in_use
  std::array<prometheus::Histogram*, kStageCount> stage_{};  // by Stage
  prometheus::Gauge* inflight_ = nullptr;

  std::mutex mutex_;  // guards series_
  std::map<std::string, PolicySeries> series_;
  std::map<int32_t, prometheus::Counter*> device_series_;  // guarded by mutex_
  std::map<std::string, prometheus::Counter*> model_series_;  // by label; guarded by mutex_
  size_t model_label_limit_ = 64;                              // guarded by mutex_
};

}  // namespace kvtrim::service
