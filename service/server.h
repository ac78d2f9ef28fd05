// kvtrimd's server: gRPC builder, health, reflection, metrics exporter, warm-up and drain.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "kernels/backend.h"
#include "kernels/engine.h"
#include "kernels/registry.h"
#include "service/config.h"
#include "service/kvtrim_service.h"
#include "service/metrics.h"
#include "service/device_mapper.h"
#include "service/gpu_metrics.h"
#include "service/model_store.h"
#include "service/process_metrics.h"
#include "service/region_registry.h"

namespace prometheus {
class Exposer;
}

namespace kvtrim::service {

/// The gRPC health service name of kvtrim (besides the server-wide name "").
inline constexpr char kHealthServiceName[] = "kvtrim.v1.Kvtrim";

/// kvtrimd's exit status after a sticky device error stopped it (RunUntilSignal).
inline constexpr int kExitDeviceFailure = 3;
/// kvtrimd's exit status when handlers still ran past the drain deadline (RunUntilSignal).
inline constexpr int kExitDrainTimeout = 4;
/// How long past --drain_timeout a drain may take before kvtrimd exits regardless.
inline constexpr std::chrono::seconds kDrainExitGrace{2};

/// One running kvtrimd: owns the policy registry, backend, engine, metrics, service, the
/// gRPC server and the Prometheus exporter. Start() returns it SERVING; Drain() stops it.
class Server {
 public:
  /// Builds everything from a validated `config`, loads the registered models from
  /// config.data_dir (skipped files are reported on stderr), starts listening with health
  /// set to NOT_SERVING, runs the warm-up (every preset once), then marks "" and
  /// "kvtrim.v1.Kvtrim" SERVING. Errors: INVALID_ARGUMENT for a bad config,
  /// FAILED_PRECONDITION when --data_dir cannot be created or listed, UNAVAILABLE when an
  /// address cannot be bound, UNIMPLEMENTED for a backend this build lacks, INTERNAL when
  /// the warm-up fails. `log` receives the start-up line and server-side
  /// call failures; it must outlive the server.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const Config& config, std::ostream& log);

  /// As Start(), but serves on `backend` instead of the one config.backend names (tests
  /// inject failing backends; embedders bring their own). `backend` must not be null.
  static absl::StatusOr<std::unique_ptr<Server>> StartWithBackend(const Config& config,
                                                                  std::unique_ptr<Backend> backend,
                                                                  std::ostream& log);

  /// Drains (if not already) and releases everything.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Marks every health service NOT_SERVING, answers new kvtrim calls UNAVAILABLE
  /// "draining", waits up to config.drain_timeout_s for running calls, then shuts gRPC
  /// down (cancelling whatever is left and closing connections). Idempotent and
  /// thread-safe; returns when the gRPC server has shut down.
  void Drain();
  /// Blocks until the server has shut down (after Drain()).
  void Wait();
  /// True once a drain has begun (SIGTERM/SIGINT, a fatal device error, or destruction).
  bool stopping() const { return stopping_.load(); }
  /// OK, or the INTERNAL error after which the backend reported itself unhealthy (a sticky
  /// CUDA error): the server then turned NOT_SERVING, logged it and drained on its own;
  /// kvtrimd exits with kExitDeviceFailure.
  absl::Status fatal_error() const;

  /// The gRPC port actually bound (the ephemeral one for port 0; 0 for unix sockets).
  int port() const { return port_; }
  /// The address clients dial ("127.0.0.1:PORT" or "unix:PATH").
  const std::string& address() const { return address_; }
  /// The Prometheus exporter port actually bound (0 when disabled).
  int metrics_port() const { return metrics_port_; }
  /// The metric families (tests read them with registry()->Collect()).
  Metrics& metrics() { return *metrics_; }
  /// The gRPC service (tests read inflight()).
  const KvtrimService& service() const { return *service_; }
  /// Frees pooled host buffers idle for longer than --host_buffer_idle_s (kvtrimd calls it
  /// every 10 s, before returning freed heap memory to the system); returns the bytes.
  size_t ExpireIdleBuffers() { return service_->ExpireIdleBuffers(); }
  /// Publishes the malloc heap's and the host buffer pool's figures (kvtrim_heap_bytes,
  /// kvtrim_host_buffer_bytes; kvtrimd calls it every 10 s, after the trim).
  void PublishMemoryMetrics() { service_->PublishMemoryMetrics(); }
  /// The registered models (loaded from --data_dir at start-up).
  ModelStore& models() { return *models_; }
  /// The validated configuration the server runs with.
  const Config& config() const { return config_; }
  /// An in-process channel to this server (tests, warm checks).
  std::shared_ptr<grpc::Channel> InProcessChannel();

 private:
  explicit Server(Config config);
  /// Builds and starts everything; `backend` null = build the configured one.
  absl::Status Init(std::ostream& log, std::unique_ptr<Backend> backend);
  /// Called by the service after a layer failed INTERNAL: when the backend is no longer
  /// healthy, records `status`, turns every health service NOT_SERVING, logs the error and
  /// wakes the watcher thread, which drains the server.
  void OnBackendFailure(const absl::Status& status);
  /// GPU backend: registers the per-device kvtrim_gpu_* metrics (NVML) on the exposer, or
  /// logs why there are none.
  void RegisterGpuMetrics(std::ostream& log);
  /// Body of watcher_: waits for a fatal error (then drains) or for destruction.
  void WatchForFatalErrors();

  Config config_;
  PolicyRegistry registry_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PolicyEngine> engine_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<ModelStore> models_;
  std::unique_ptr<DeviceMapper> device_mapper_;  // GPU backend only
  std::vector<int> devices_;                     // CUDA ordinals served (GPU backend)
  std::unique_ptr<RegionRegistry> regions_;
  std::unique_ptr<KvtrimService> service_;
  std::unique_ptr<grpc::Server> server_;
  // process_* metrics, read at each scrape (the exposer, declared after it, holds a weak reference).
  std::shared_ptr<ProcessCollector> process_metrics_ = std::make_shared<ProcessCollector>();
  std::shared_ptr<GpuCollector> gpu_metrics_;  // GPU backend with NVML only
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  size_t auth_tenants_ = 0;  // tenants of --auth_tokens_file (0: no tokens)
  int metrics_port_ = 0;
  std::string address_;
  std::string backend_detail_;  // e.g. the GPU's name, for the start-up line
  std::atomic<bool> port_file_written_{false};  // --port_file exists and is ours to remove
  std::ostream* log_ = nullptr;
  std::once_flag drain_once_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex fatal_mutex_;           // guards fatal_ and closing_
  std::condition_variable fatal_signalled_;  // wakes watcher_
  absl::Status fatal_;
  bool closing_ = false;                     // the destructor runs: watcher_ ends
  std::thread watcher_;
};

/// Blocks SIGTERM and SIGINT in the calling thread (call it in main() before any other
/// thread starts, so every thread inherits the mask).
void BlockShutdownSignals();

/// Waits for SIGTERM or SIGINT on a dedicated thread, then drains `server`; returns once
/// the server has shut down, either way: 0 after a signal, kExitDeviceFailure when a
/// sticky device error drained it. Requires BlockShutdownSignals() first. Once the drain
/// starts, the process ends within --drain_timeout + kDrainExitGrace whatever its handlers
/// do (StartExitWatchdog).
int RunUntilSignal(Server& server, std::ostream& log);

/// Ends the process with `exit_status` (std::_Exit, a line to `log` first) unless it has
/// exited on its own within `after`: a handler blocked in a system call outlives every
/// cancellation, and must not keep a draining kvtrimd alive.
void StartExitWatchdog(std::chrono::steady_clock::duration after, int exit_status,
                       std::ostream& log);

}  // namespace kvtrim::service
