#include "service/server.h"

#include <csignal>
#include <cstring>
#include <exception>
#include <pthread.h>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/cpu/cpu_backend.h"
#include "prometheus/exposer.h"
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

}  // namespace

Server::Server(Config config) : config_(std::move(config)) {}

Server::~Server() {
  Drain();
  exposer_.reset();
  server_.reset();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const Config& config, std::ostream& log) {
  if (auto st = config.Validate(); !st.ok()) return st;
  std::unique_ptr<Server> server(new Server(config));
  if (auto st = server->Init(log); !st.ok()) return st;
  return server;
}

absl::Status Server::Init(std::ostream& log) {
  RegisterBuiltinPolicies(&registry_);
  if (config_.ResolvedBackendName() == "cpu") {
    backend_ = std::make_unique<CpuBackend>(config_.workers);
  } else {
    return absl::UnimplementedError(
        "--backend=gpu: the GPU backend is not part of this kvtrimd release; use --backend=cpu");
  }
  engine_ = std::make_unique<PolicyEngine>(registry_, *backend_);
  std::vector<std::string> presets;
  for (const auto& preset : registry_.presets()) presets.push_back(preset.name);
  metrics_ = std::make_unique<Metrics>(KvtrimVersion(), std::string(backend_->name()), presets);
  service_ = std::make_unique<KvtrimService>(*engine_, *metrics_, config_.max_inflight, &log);

  InitGrpcPluginsOnce();
  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(config_.listen, grpc::InsecureServerCredentials(), &selected_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_message_bytes));
  // A second kvtrimd on the same port is an error, not a silent load-balancing partner.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
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

  const bool is_unix = absl::StartsWith(config_.listen, "unix:");
  if (is_unix) {
    address_ = config_.listen;
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
    const auto ports = exposer_->GetListeningPorts();
    metrics_port_ = ports.empty() ? 0 : ports.front();
  }

  WarmUpReport report;
  if (auto st = WarmUp(*engine_, &report); !st.ok()) {
    log << "kvtrimd: warm-up failed, staying NOT_SERVING: " << st << std::endl;
    return st;
  }
  health->SetServingStatus("", true);
  health->SetServingStatus(kHealthServiceName, true);

  const std::string metrics_address =
      config_.metrics_listen.empty()
          ? std::string("disabled")
          : absl::StrCat("http://",
                         config_.metrics_listen.substr(0, config_.metrics_listen.rfind(':')), ":",
                         metrics_port_, "/metrics");
  log << "kvtrimd " << KvtrimVersion() << " serving on " << address_ << " metrics "
      << metrics_address << " backend " << backend_->name() << " workers " << config_.workers
      << " max_inflight " << config_.max_inflight << " max_message_bytes "
      << config_.max_message_bytes << " warmed " << report.warmed.size() << " policies"
      << (report.skipped.empty() ? std::string()
                                 : absl::StrCat(" (need a model: ",
                                                absl::StrJoin(report.skipped, ","), ")"))
      << std::endl;
  return absl::OkStatus();
}

void Server::Drain() {
  std::call_once(drain_once_, [this] {
    if (server_ == nullptr) return;
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(false);
      health->Shutdown();  // ends Watch streams so they do not hold the drain
    }
    // New kvtrim calls get UNAVAILABLE from here on; running ones finish. gRPC's own
    // Shutdown(deadline) would also wait for idle client connections until the deadline,
    // so wait for our handlers ourselves and then shut gRPC down at once.
    if (service_ != nullptr) {
      service_->StartDraining();
      service_->WaitIdle(std::chrono::steady_clock::now() +
                         std::chrono::seconds(config_.drain_timeout_s));
    }
    server_->Shutdown(std::chrono::system_clock::now());  // cancels whatever is left
  });
}

void Server::Wait() {
  if (server_ != nullptr) server_->Wait();
}

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void RunUntilSignal(Server& server, std::ostream& log) {
  std::thread waiter([&server, &log] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int signal_number = 0;
    sigwait(&set, &signal_number);
    log << "kvtrimd: " << (signal_number == SIGTERM ? "SIGTERM" : "SIGINT")
        << ": NOT_SERVING, draining in-flight calls (up to " << server.config().drain_timeout_s
        << " s)" << std::endl;
    server.Drain();
  });
  server.Wait();
  waiter.join();
  log << "kvtrimd: stopped" << std::endl;
}

}  // namespace kvtrim::service
