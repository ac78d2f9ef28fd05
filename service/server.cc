#include "base/status_macros.h"
#include "kvtrim/v1/http2_window.h"
#include "service/server.h"

#include <csignal>
#include <cstring>
#include <exception>
#include <iostream>
#include <pthread.h>
#include <sys/stat.h>
#include <cstdlib>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "service/backend_factory.h"
#include "service/bearer_tokens.h"
#include "service/limit_metrics.h"
#include "service/port_file.h"
#include "service/tls_credentials.h"
#include "service/warmup.h"

namespace kvtrim::service {

namespace {

/// Process-wide gRPC plugins: the default health service and server reflection.
void InitGrpcPluginsOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
}

/// A flag's seconds as a gRPC channel argument's milliseconds (the flags' ranges keep it in
/// an int).
int SecondsToMilliseconds(int32_t seconds) { return seconds * 1000; }

/// The file of a "unix:PATH" / "unix:///PATH" listen address.
std::string SocketPath(const std::string& listen) {
  std::string path = listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  return path;
}

/// Sets the socket file of `listen` to `mode`; FAILED_PRECONDITION naming the flag.
absl::Status SetSocketMode(const std::string& listen, uint32_t mode) {
  const std::string path = SocketPath(listen);
  if (chmod(path.c_str(), static_cast<mode_t>(mode)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--unix_socket_mode: cannot set the mode of '", path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

Server::Server(Config config) : config_(std::move(config)) {}

Server::~Server() {
  Drain();
  {
    std::lock_guard<std::mutex> lock(fatal_mutex_);
    closing_ = true;
  }
  fatal_signalled_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  exposer_.reset();
  server_.reset();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Config& config, std::ostream& log) {
  KVTRIM_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Server> server(new Server(config));
  KVTRIM_RETURN_IF_ERROR(server->Init(log, nullptr));
  return server;
}

absl::StatusOr<std::unique_ptr<Server>> Server::StartWithBackend(const Config& config,
                                                                 std::unique_ptr<Backend> backend,
                                                                 std::ostream& log) {
  if (backend == nullptr) return absl::InvalidArgumentError("StartWithBackend: backend is null");
  KVTRIM_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Server> server(new Server(config));
  KVTRIM_RETURN_IF_ERROR(server->Init(log, std::move(backend)));
  return server;
}

absl::Status Server::fatal_error() const {
  std::lock_guard<std::mutex> lock(fatal_mutex_);
  return fatal_;
}

void Server::RegisterGpuMetrics(std::ostream& log) {
  if (device_mapper_ == nullptr) return;
  std::vector<GpuDeviceLabel> devices;
  for (const DeviceMapper::Served& served : device_mapper_->ServedList()) {
    devices.push_back({served.ordinal, device_mapper_->FormatUuid(served.uuid16)});
  }
  std::string why;
  std::shared_ptr<const NvmlReader> nvml = NvmlReader::Load(&why);
  if (nvml == nullptr) {
    log << "kvtrimd: no GPU memory / utilisation metrics: " << why << std::endl;
    return;
  }
  gpu_metrics_ = std::make_shared<GpuCollector>(
      std::move(devices), [nvml](const std::string& uuid) { return nvml->Read(uuid); });
  exposer_->RegisterCollectable(gpu_metrics_);
}

void Server::OnBackendFailure(const absl::Status& status) {
  if (backend_->healthy()) return;  // a failure of this request only
  {
    std::lock_guard<std::mutex> lock(fatal_mutex_);
    if (!fatal_.ok()) return;  // already shutting down
    fatal_ = status;
  }
  if (server_ != nullptr) {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(false);
    }
  }
  *log_ << "kvtrimd: sticky device error, NOT_SERVING, shutting down with exit status "
        << kExitDeviceFailure << ": " << status << std::endl;
  fatal_signalled_.notify_all();
}

void Server::WatchForFatalErrors() {
  std::unique_lock<std::mutex> lock(fatal_mutex_);
  fatal_signalled_.wait(lock, [this] { return !fatal_.ok() || closing_; });
  if (fatal_.ok()) return;  // destruction
  lock.unlock();
  Drain();
}

absl::Status Server::Init(std::ostream& log, std::unique_ptr<Backend> backend) {
  log_ = &log;
  RegisterBuiltinPolicies(&registry_);
  if (backend != nullptr) {
    backend_ = std::move(backend);
  } else {
    auto created = CreateBackend(config_, &backend_detail_, &devices_);
    if (!created.ok()) return created.status();
    backend_ = *std::move(created);
  }
  engine_ = std::make_unique<PolicyEngine>(registry_, *backend_);
  std::vector<std::string> presets;
  for (const auto& preset : registry_.presets()) presets.push_back(preset.name);
  metrics_ = std::make_unique<Metrics>(KvtrimVersion(), std::string(backend_->name()), presets);
  metrics_->SetModelLabelLimit(static_cast<size_t>(config_.max_models));
  PublishLimits(config_, *metrics_->registry());
  ModelStoreOptions store_options;
  store_options.data_dir = config_.data_dir;
  store_options.max_models = config_.max_models;
  store_options.max_model_bytes = config_.max_model_bytes;
  models_ = std::make_unique<ModelStore>(store_options, std::cerr);
  absl::StatusOr<int> loaded = models_->LoadAll();  // before the server answers anything
  if (!loaded.ok()) return loaded.status();
  KvtrimService::Options service_options;
  if (!config_.auth_tokens_file.empty()) {
    auto tokens = BearerTokens::Load(config_.auth_tokens_file);
    if (!tokens.ok()) return tokens.status();
    service_options.tokens = *std::move(tokens);
  }
  auth_tenants_ = service_options.tokens ? service_options.tokens->tenants() : 0;
  service_options.max_inflight = config_.max_inflight;
  service_options.max_leases = config_.max_leases;
  service_options.admission_wait = std::chrono::milliseconds(config_.admission_wait_ms);
  service_options.default_numerics = config_.numerics;
  service_ = std::make_unique<KvtrimService>(*engine_, *backend_, *metrics_, *models_,
                                             service_options, &log);
  service_->SetBackendFailureHook([this](const absl::Status& status) { OnBackendFailure(status); });
  // Zero-copy transports: a CUDA IPC region is mapped on the device it lives on (an
  // injected GPU backend: device 0).
  if (std::string(backend_->name()) == "gpu") {
    if (devices_.empty()) devices_.push_back(0);
    auto mapper = MakeCudaDeviceMapper(devices_);
    if (!mapper.ok()) return mapper.status();
    device_mapper_ = *std::move(mapper);
  }
  RegionOptions region_options;
  region_options.allow_client_shm = config_.allow_client_shm;
  region_options.max_regions_per_client = config_.max_regions_per_client;
  region_options.max_pinned_shm_bytes = static_cast<uint64_t>(config_.max_pinned_shm_bytes);
  regions_ = std::make_unique<RegionRegistry>(region_options, device_mapper_.get());
  TransportOptions transport_options;
  transport_options.max_layer_bytes = config_.max_layer_bytes;
  transport_options.session_read_ahead = config_.session_read_ahead;
  transport_options.session_parallel_layers = config_.session_parallel_layers;
  transport_options.host_buffer_pool_bytes = static_cast<size_t>(config_.host_buffer_pool_bytes);
  transport_options.host_buffer_idle = std::chrono::seconds(config_.host_buffer_idle_s);
  if (device_mapper_ != nullptr && config_.max_pinned_buffer_bytes > 0) {
    DeviceMapper* mapper = device_mapper_.get();  // outlives the service (declared first)
    transport_options.buffer_locker = {
        [mapper](void* data, size_t bytes) { return mapper->LockHost(data, bytes); },
        [mapper](void* data) { mapper->UnlockHost(data); }};
    transport_options.max_pinned_buffer_bytes =
        static_cast<size_t>(config_.max_pinned_buffer_bytes);
  }
  service_->SetTransports(regions_.get(), transport_options);

  InitGrpcPluginsOnce();
  grpc::ServerBuilder builder;
  int selected_port = 0;
  auto credentials = MakeServerCredentials(config_);
  if (!credentials.ok()) return credentials.status();
  builder.AddListeningPort(config_.listen, *credentials, &selected_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_message_bytes));
  // A second kvtrimd on the same port is an error, not a silent load-balancing partner.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (config_.http2_window_bytes > 0) {
    for (const auto& [name, value] : v1::Http2WindowArguments(config_.http2_window_bytes)) {
      builder.AddChannelArgument(name, value);
    }
  }
  if (config_.max_connection_age_s > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               SecondsToMilliseconds(config_.max_connection_age_s));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               SecondsToMilliseconds(config_.max_connection_age_grace_s));
  }
  builder.RegisterService(service_.get());
  const bool is_unix = absl::StartsWith(config_.listen, "unix:");
  // A unix socket is created with --unix_socket_mode: no moment with wider permissions.
  const mode_t previous_umask = is_unix ? umask(0777 & ~config_.unix_socket_mode) : 0;
  server_ = builder.BuildAndStart();
  if (is_unix) umask(previous_umask);
  if (server_ == nullptr || selected_port == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot listen on '", config_.listen,
        "' (address in use, not local, or not resolvable)"));
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return absl::InternalError("the gRPC health service is missing");
  health->SetServingStatus("", false);
  health->SetServingStatus(kHealthServiceName, false);

  if (is_unix) {
    address_ = config_.listen;
    KVTRIM_RETURN_IF_ERROR(SetSocketMode(config_.listen, config_.unix_socket_mode));
  } else {
    port_ = selected_port;
    address_ = absl::StrCat(config_.listen.substr(0, config_.listen.rfind(':')), ":", port_);
  }

  if (!config_.metrics_listen.empty()) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(config_.metrics_listen, 2);
    } catch (const std::exception& e) {
      // prometheus-cpp reports bind failures by exception; convert at the boundary.
      return absl::UnavailableError(absl::StrCat("--metrics_listen: cannot listen on '",
                                                 config_.metrics_listen, "': ", e.what()));
    }
    exposer_->RegisterCollectable(metrics_->registry());
    exposer_->RegisterCollectable(process_metrics_);
    RegisterGpuMetrics(log);
    const auto ports = exposer_->GetListeningPorts();
    metrics_port_ = ports.empty() ? 0 : ports.front();
  }

  // Every preset once through the backend that will serve (the GPU's kernels load here).
  WarmUpReport report;
  if (auto st = WarmUp(*engine_, *backend_, &report); !st.ok()) {
    log << "kvtrimd: warm-up failed, staying NOT_SERVING: " << st << std::endl;
    return st;
  }
  const std::string metrics_host_port =
      config_.metrics_listen.empty()
          ? std::string()
          : absl::StrCat(config_.metrics_listen.substr(0, config_.metrics_listen.rfind(':')),
                         ":", metrics_port_);
  watcher_ = std::thread([this] { WatchForFatalErrors(); });
  health->SetServingStatus("", true);
  health->SetServingStatus(kHealthServiceName, true);
  // The serving line goes out (flushed) before the port file, so whoever sees the port file
  // also finds the line in the log.
  const std::string metrics_address = metrics_host_port.empty()
                                          ? std::string("disabled")
                                          : absl::StrCat("http://", metrics_host_port, "/metrics");
  log << "kvtrimd " << KvtrimVersion() << " serving on " << address_ << " metrics "
      << metrics_address << " backend " << backend_->name()
      << (backend_detail_.empty() ? std::string() : absl::StrCat(" (", backend_detail_, ")"))
      << " numerics " << NumericsName(config_.numerics) << " workers " << config_.workers
      << " max_inflight " << config_.max_inflight << " max_message_bytes "
      << config_.max_message_bytes << " models " << *loaded
      << (config_.data_dir.empty() ? std::string(" (in memory only)")
                                   : absl::StrCat(" (loaded from ", config_.data_dir, ")"))
      << " warmed " << report.warmed.size() << " policies"
      << (report.skipped.empty() ? std::string()
                                 : absl::StrCat(" (need a model: ",
                                                absl::StrJoin(report.skipped, ","), ")"))
      << " security " << TransportSecurityName(config_) << " auth "
      << (auth_tenants_ == 0 ? std::string("none")
                             : absl::StrCat("tokens (", auth_tenants_, " tenants)"))
      << std::endl;
  // The port file is the readiness signal of scripts and tests: whoever sees it finds the
  // server SERVING and the line above logged. A failure to write it fails the start-up (the
  // caller drains).
  if (!config_.port_file.empty()) {
    KVTRIM_RETURN_IF_ERROR(WritePortFile(config_.port_file, {address_, metrics_host_port}));
    port_file_written_ = true;
  }
  return absl::OkStatus();
}

void Server::Drain() {
  std::call_once(drain_once_, [this] {
    stopping_.store(true);
    // Whoever waits for the port file must not find a server that stopped serving.
    if (port_file_written_) RemovePortFile(config_.port_file);
    if (server_ == nullptr) return;
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(false);
      health->Shutdown();  // ends Watch streams so they do not hold the drain
    }
    // New kvtrim calls get UNAVAILABLE from here on; running ones finish. gRPC's own
    // Shutdown(deadline) would also wait for idle client connections until the deadline,
    // so wait for our handlers ourselves and then shut gRPC down after a short grace.
    if (service_ != nullptr) {
      service_->StartDraining();
      service_->WaitIdle(std::chrono::steady_clock::now() +
                         std::chrono::seconds(config_.drain_timeout_s));
    }
    // A handler that has returned may still be sending its status: give those a short
    // grace before gRPC cancels whatever is left (cancelling at once raced with them).
    constexpr auto kStatusGrace = std::chrono::milliseconds(500);
    server_->Shutdown(std::chrono::system_clock::now() + kStatusGrace);
  });
}

void Server::Wait() {
  if (server_ != nullptr) server_->Wait();
}

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void StartExitWatchdog(std::chrono::steady_clock::duration after, int exit_status,
                       std::ostream& log) {
  std::thread([after, exit_status, &log] {
    std::this_thread::sleep_for(after);
    log << "kvtrimd: calls still running past the drain deadline; exiting without them (exit "
           "status "
        << exit_status << ")" << std::endl;
    std::_Exit(exit_status);
  }).detach();
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int RunUntilSignal(Server& server, std::ostream& log) {
  std::thread waiter([&server, &log] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // sigtimedwait needs them blocked here
    // Wakes every 100 ms to notice a drain that a fatal device error started on its own.
    const timespec tick{0, 100 * 1000 * 1000};
    while (!server.stopping()) {
      const int signal_number = sigtimedwait(&set, nullptr, &tick);
      if (signal_number != SIGTERM && signal_number != SIGINT) continue;  // timeout, EINTR
      log << "kvtrimd: " << (signal_number == SIGTERM ? "SIGTERM" : "SIGINT")
          << ": NOT_SERVING, draining in-flight calls (up to " << server.config().drain_timeout_s
          << " s)" << std::endl;
      StartExitWatchdog(std::chrono::seconds(server.config().drain_timeout_s) + kDrainExitGrace,
                        kExitDrainTimeout, log);
      server.Drain();
      return;
    }
  });
  server.Wait();
  waiter.join();
  const absl::Status fatal = server.fatal_error();
  if (!fatal.ok()) {
    log << "kvtrimd: stopped after a sticky device error (exit status " << kExitDeviceFailure
        << ")" << std::endl;
    return kExitDeviceFailure;
  }
  log << "kvtrimd: stopped" << std::endl;
  return 0;
}

}  // namespace kvtrim::service
