// kvtrimd configuration: typed, validated once at start-up from command-line flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/policy_kind.h"

namespace kvtrim::service {

/// Which compute backend serves requests.
enum class BackendKind {
  kAuto,  // the GPU when this build has CUDA and a device is visible, else the CPU
  kCpu,   // the threaded CPU reference backend
  kGpu,   // the CUDA backend (needs a CUDA build and a visible device)
};

/// The validated configuration of one kvtrimd process. Built by ConfigFromFlags() (the
/// daemon) or directly (tests); Validate() must pass before a server is started with it.
struct Config {
  /// gRPC listen address: "host:port" (port 0 = pick a free port) or "unix:PATH".
  std::string listen = "127.0.0.1:50051";
  /// Prometheus /metrics HTTP address "host:port" (port 0 = pick a free port); empty
  /// disables the exporter (metrics are still collected in-process).
  std::string metrics_listen = "127.0.0.1:9464";
  /// Readiness file: once SERVING, kvtrimd writes the addresses it bound (the ephemeral
  /// ones for port 0) to this path atomically (service/port_file.h), and removes it when it
  /// stops serving. Empty = none.
  std::string port_file;
  /// Largest gRPC message the server accepts, bytes. Larger messages are rejected by gRPC
  /// with RESOURCE_EXHAUSTED before the service sees them.
  int64_t max_message_bytes = int64_t{64} << 20;
  /// Compute threads of the CPU backend, or worker contexts of the GPU backend (layers
  /// computed on the device at once, each with its own stream and device arena).
  int workers = 1;
  /// Most Compress + CompressSession calls served at once; more get RESOURCE_EXHAUSTED.
  int max_inflight = 64;
  /// Milliseconds a Compress / CompressSession call that finds every max_inflight slot
  /// taken waits for one before it is refused (0: at once).
  int admission_wait_ms = 200;
  /// Most Regions leases held at once; more get RESOURCE_EXHAUSTED "max_leases".
  int max_leases = 1024;
  /// Requested backend (auto resolves to cpu in a build without CUDA).
  BackendKind backend = BackendKind::kAuto;
  /// Seconds to wait for in-flight calls after SIGTERM/SIGINT before cancelling them.
  int drain_timeout_s = 30;
  /// GPU backend: device memory its worker arenas may hold together, bytes; each worker's
  /// arena is capped at gpu_memory_limit_bytes / workers. 0 = no cap but free memory.
  /// A layer that needs more than a worker's cap is answered RESOURCE_EXHAUSTED.
  int64_t gpu_memory_limit_bytes = 0;
  /// GPU backend: launch sequences each worker keeps as CUDA graphs; a layer whose shapes,
  /// arena regions and input addresses repeat is replayed as one graph. 0 = off (default:
  /// experimental, docs/gpu.md "Launch graphs").
  int gpu_launch_graphs = 0;
  /// HTTP/2 flow-control window and largest frame, bytes (--http2_window_bytes); 0 = gRPC's
  /// defaults (64 KiB grown by its BDP probe).
  int32_t http2_window_bytes = 0;
  /// Connections are closed (GOAWAY) after about this many seconds so that clients
  /// re-resolve and reach new replicas (--max_connection_age_s); 0 = never.
  int32_t max_connection_age_s = 0;
  /// How long calls in flight on an aged connection may still run
  /// (--max_connection_age_grace_s).
  int32_t max_connection_age_grace_s = 30;
  /// GPU backend: CUDA ordinals to compute on (--devices); empty = every visible device.
  std::vector<int> devices;
  /// TLS: PEM files of the server's certificate chain and private key (--tls_cert,
  /// --tls_key; both or neither; empty = plaintext), and of the CA that client certificates
  /// must chain to (--tls_client_ca: mutual TLS, a client without a valid certificate is
  /// refused at the handshake).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  /// --auth_tokens_file: per-tenant bearer tokens (BearerTokens); empty = none.
  std::string auth_tokens_file;
  /// --unix_socket_mode: permissions of a unix:PATH socket file (octal, <= 0777).
  uint32_t unix_socket_mode = 0660;
  /// Directory where registered models are persisted, one "<hex>.kvtmodel" file each, and
  /// loaded from at start-up; created when missing. Empty = models live in memory only and
  /// are lost on restart.
  std::string data_dir;
  /// Most registered models held at once; RegisterModel beyond it is RESOURCE_EXHAUSTED.
  int max_models = 16;
  /// Largest model registration (the sum of its weights' bytes) RegisterModel accepts.
  int64_t max_model_bytes = int64_t{16} << 30;
  /// Zero-copy transports: lets clients register host shared-memory segments and CUDA IPC
  /// allocations (the Regions RPC) and send tensors that point into them. Off by default:
  /// only trusted workers on the same node should reach a kvtrimd that allows it.
  bool allow_client_shm = false;
  /// Most regions one client lease holds at once.
  int max_regions_per_client = 64;
  /// Host shm segments are page-locked for direct device copies while all pinned segments
  /// stay within this many bytes; 0 = read every segment with pread.
  int64_t max_pinned_shm_bytes = int64_t{32} << 30;
  /// Largest layer a session may send as chunked tensors (sum of its chunked tensors), and
  /// largest host shm tensor read into kvtrimd's memory.
  int64_t max_layer_bytes = int64_t{8} << 30;
  /// Layers a session reads and decodes ahead of the one being computed.
  int session_read_ahead = 2;
  /// Layers of one session computed at once (per-layer policies), answered in order.
  int session_parallel_layers = 2;
  /// Host buffers of finished layers (host shm reads, assembled chunks) kept for reuse by the
  /// next ones, at most these many idle bytes together; 0 = every layer allocates afresh.
  int64_t host_buffer_pool_bytes = int64_t{1} << 30;
  /// Seconds a pooled host buffer may stay unused before it is freed (0 = kept until reused).
  int host_buffer_idle_s = 30;
  /// With the GPU backend, pooled buffers that chunked tensors arrive in are page-locked
  /// while the locked ones (idle or in use) stay within this many bytes; 0 = never.
  int64_t max_pinned_buffer_bytes = int64_t{8} << 30;
  /// Numerics of requests that leave CompressionSettings.numerics unspecified: kFast
  /// (tensor cores / FMA where the backend has a fast path, within docs/numerics.md's
  /// tolerance of exact) or kExact (the canonical arithmetic, CPU and GPU bit-identical).
  Numerics numerics = Numerics::kFast;

  /// Checks every field; errors are INVALID_ARGUMENT naming the flag ("--workers: ...").
  absl::Status Validate() const;
  /// The backend to run: "gpu" for --backend=gpu, and for --backend=auto in a CUDA build
  /// when `gpu_visible` (a CUDA device was found); "cpu" otherwise.
  std::string ResolvedBackendName(bool gpu_visible = false) const;
};

/// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();

/// Checks a "host:port" or "unix:PATH" address; errors name `flag` ("--listen").
absl::Status ValidateListenAddress(const std::string& address, const std::string& flag,
                                   bool allow_unix);

/// Parses argv strictly before absl sees it, so that every bad flag exits with code 2
/// and a message naming the flag: unknown flags, unparsable values, missing values and
/// positional arguments are INVALID_ARGUMENT. Applies the flag values it parses.
/// Usage flags (--helpfull, --version, --flagfile, ...) are left to absl.
absl::Status ParseCommandLineStrict(int argc, char** argv);

/// True when argv asks for our help (--help, -h, --helpshort, -help).
bool WantsHelp(int argc, char** argv);

/// The --help text: a usage line and every kvtrimd flag with its meaning and default.
std::string UsageText();

/// Reads the kvtrimd flags into a Config and validates it.
absl::StatusOr<Config> ConfigFromFlags();

/// --devices: "all" (or "") -> empty (every visible device), else comma-separated distinct
/// CUDA ordinals in [0, 1023], at most 64. INVALID_ARGUMENT naming --devices otherwise.
absl::StatusOr<std::vector<int>> ParseDevices(const std::string& text);

/// An octal file mode such as "0660" (at most 0777). INVALID_ARGUMENT naming --`flag`.
absl::StatusOr<uint32_t> ParseFileMode(const char* flag, const std::string& text);

/// The kvtrim version ("0.1.0"), from the CMake project version.
std::string KvtrimVersion();

}  // namespace kvtrim::service
