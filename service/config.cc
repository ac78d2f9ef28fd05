#include "service/config.h"

#include <algorithm>
#include <climits>
#include <optional>
#include <thread>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "version/build_version.h"

#ifndef KVTRIM_WITH_CUDA
#define KVTRIM_WITH_CUDA 0
#endif

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address: HOST:PORT (PORT 0 picks a free port) or unix:PATH.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus exporter address HOST:PORT serving GET /metrics; empty disables it.");
ABSL_FLAG(std::string, port_file, "",
          "Readiness file: once SERVING (warm-up done), kvtrimd writes the addresses it bound "
          "to this path, atomically, as two lines 'grpc=HOST:PORT' and 'metrics=HOST:PORT' "
          "(empty when the exporter is off), and removes it when it stops serving. With "
          "--listen=127.0.0.1:0 this is how a script or test learns the port it got. Empty = "
          "none.");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20,
          "Largest gRPC message accepted, in bytes (1024 .. 2147483647). Larger messages are "
          "rejected by gRPC with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, workers,
          static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())),
          "Compute threads of the CPU backend, or worker contexts of the GPU backend (layers "
          "computed on the GPU at once, each with its own CUDA stream, device arena and pinned "
          "staging buffers) (1 .. 1024); default: hardware concurrency.");
ABSL_FLAG(int32_t, max_inflight, 64,
          "Most Compress and CompressSession calls served at once (1 .. 1048576); more get "
          "RESOURCE_EXHAUSTED \"max_inflight\".");
ABSL_FLAG(int32_t, admission_wait_ms, 200,
          "How long a Compress or CompressSession call that finds all --max_inflight slots "
          "taken waits for one before it gets RESOURCE_EXHAUSTED \"max_inflight\" "
          "(0 .. 60000; 0 = refused at once). It absorbs calls whose cancellation or deadline "
          "the server has not seen yet; at most --max_inflight calls wait at once.");
ABSL_FLAG(int32_t, max_leases, 1024,
          "Most Regions leases (open Regions streams of zero-copy clients) held at once "
          "(1 .. 1048576); more get RESOURCE_EXHAUSTED \"max_leases\". An idle lease holds "
          "no thread, only its registered regions.");
ABSL_FLAG(std::string, backend, "auto",
          "Compute backend: auto | cpu | gpu. auto uses the GPU when this build has CUDA and a "
          "CUDA device is visible, else the CPU. gpu in a build without CUDA exits 2; gpu "
          "with no visible CUDA device exits 1 at start-up (\"cannot start: --backend=gpu: "
          "no CUDA device is visible\").");
ABSL_FLAG(std::string, numerics, "fast",
          "Numerics of requests that leave settings.numerics unspecified: fast | exact. fast "
          "computes on tensor cores / with FMA where the backend has a fast path for the "
          "policy, within the tolerance of exact that docs/numerics.md derives; exact is the "
          "canonical arithmetic, bit-identical on CPU and GPU. A policy without a fast path "
          "is computed exact either way; each LayerResult.numerics reports the mode used.");
ABSL_FLAG(int32_t, drain_timeout_s, 30,
          "On SIGTERM/SIGINT: seconds to wait for in-flight calls before cancelling them "
          "(0 .. 86400).");
ABSL_FLAG(int64_t, gpu_memory_limit_bytes, 0,
          "GPU backend: device memory all worker arenas may hold together, in bytes; each "
          "worker's arena is capped at this / --workers, and a layer needing more is answered "
          "RESOURCE_EXHAUSTED. 0 = no cap but the device's free memory.");
ABSL_FLAG(int32_t, http2_window_bytes, 0,
          "HTTP/2 flow-control window and largest frame of every connection, bytes "
          "(0 .. 1073741824): positive values replace gRPC's 64 KiB windows grown by its BDP "
          "probe with this fixed window (frames up to 16 MiB); 0 = gRPC's defaults.");
ABSL_FLAG(int32_t, max_connection_age_s, 0,
          "Closes every client connection after about this many seconds (HTTP/2 GOAWAY; gRPC "
          "adds +-10 % jitter), so that clients re-resolve the target and spread over "
          "replicas added since (the remote shape's autoscaling). Calls in flight then get "
          "--max_connection_age_grace_s to finish. 0 = never (default); at most 604800.");
ABSL_FLAG(int32_t, max_connection_age_grace_s, 30,
          "With --max_connection_age_s: how long calls in flight on an aged connection may "
          "still run before it is closed (a session or Regions stream longer than this is "
          "cut off and must reconnect).");
ABSL_FLAG(std::string, devices, "all",
          "GPU backend: the CUDA devices kvtrimd computes on: \"all\" (every visible device) "
          "or ordinals such as \"0,2\". A CUDA IPC region is computed on the device it lives "
          "on; host layers go to the least loaded device. The gpu memory cap and --workers "
          "apply per device.");

ABSL_FLAG(int32_t, gpu_launch_graphs, 0,
          "GPU backend, experimental: launch sequences each worker keeps as CUDA graphs "
          "(0 .. 4096; 64 is a good value). A layer whose launches repeat (same shapes, working "
          "memory and input addresses, seen once before) is replayed with one cudaGraphLaunch "
          "instead of one call per kernel. 0 (default) issues every launch one by one.");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of the server's TLS certificate chain; with --tls_key, kvtrim's gRPC port "
          "speaks TLS only. Empty (default) = plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM file of the CA(s) client certificates must chain to: mutual TLS, clients "
          "without a valid certificate are refused at the handshake. Needs --tls_cert.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of per-tenant bearer tokens, one `<token> <tenant>` per line ('#' comments). "
          "Every kvtrim.v1 call must then send `authorization: Bearer <token>` (else "
          "UNAUTHENTICATED), and leases and regions are scoped to the token's tenant. Empty "
          "(default) = no tokens. Read at start-up (<= 1 MiB).");
ABSL_FLAG(std::string, unix_socket_mode, "0660",
          "Permissions (octal) of the socket file when --listen is unix:PATH, set at start-up: "
          "who on the node may connect. 0600 = kvtrimd's user only.");
ABSL_FLAG(std::string, data_dir, "",
          "Directory where registered models are persisted (one <hex>.kvtmodel file each) and "
          "loaded from at start-up; created when missing. A corrupt or truncated file is "
          "skipped with one line on stderr. Empty = models are kept in memory only and lost "
          "on restart.");
ABSL_FLAG(int32_t, max_models, 16,
          "Most registered models held at once (1 .. 4096); RegisterModel beyond it gets "
          "RESOURCE_EXHAUSTED \"--max_models\".");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{16} << 30,
          "Largest model registration accepted, in bytes: the sum of its weights (W_O, query "
          "statistics, profiles) (1024 .. 2^40). Each RegisterModel message is also bounded "
          "by --max_message_bytes.");

ABSL_FLAG(bool, allow_client_shm, false,
          "Zero-copy transports: lets clients register POSIX shared-memory segments and CUDA "
          "IPC device allocations on a Regions stream and send tensors that point into them "
          "(host_shm / cuda_ipc). Off by default; enable only where every client on the node "
          "is trusted with the sidecar's read access to what it registers.");
ABSL_FLAG(int32_t, max_regions_per_client, 64,
          "Most regions (shm segments, CUDA IPC allocations and events) one client lease holds "
          "at once (1 .. 65536); more get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_pinned_shm_bytes, int64_t{32} << 30,
          "With the GPU backend, host shm segments are mapped and page-locked at registration "
          "so that the GPU copies their tensors by DMA, while the pinned segments of all "
          "clients stay within this many bytes (0 .. 2^44; 0 = never: every segment is read "
          "with pread into kvtrimd's memory).");
ABSL_FLAG(int64_t, max_layer_bytes, int64_t{8} << 30,
          "Largest layer a CompressSession may send as chunked tensors, in bytes: the sum of "
          "the layer's chunked tensors (1024 .. 2^40); more get RESOURCE_EXHAUSTED. Also the "
          "largest host_shm tensor kvtrimd reads into its memory.");
ABSL_FLAG(int64_t, host_buffer_pool_bytes, int64_t{1} << 30,
          "Host memory of finished layers (host shm reads, assembled chunks, misaligned inline "
          "copies of 1 MiB or more) kept for the next layers, in idle bytes at most (0 .. 2^40; "
          "0 = every layer allocates afresh). Reused pages are already mapped: a 64 MiB shm "
          "read no longer page-faults.");
ABSL_FLAG(int32_t, host_buffer_idle_s, 30,
          "Seconds a buffer of that pool may stay unused before it is freed, so that the "
          "memory kept follows the recent load (0 .. 86400; 0 = kept until reused).");
ABSL_FLAG(int64_t, max_pinned_buffer_bytes, int64_t{8} << 30,
          "With the GPU backend, the pooled host buffers that a session's chunked tensors are "
          "received into are page-locked once, when created, so that the GPU copies each layer "
          "from them by DMA (no staging copy, the NaN / Inf check on the device), while the "
          "locked buffers, idle or in use, stay within this many bytes (0 .. 2^44; 0 = never).");
ABSL_FLAG(int32_t, session_parallel_layers, 2,
          "Layers of one CompressSession computed at once for per-layer policies (1 .. 16; 1 = "
          "one after the other); answers still go out in the order the layers came. With the "
          "GPU backend, at most --workers of them run at a time.");
ABSL_FLAG(int32_t, session_read_ahead, 2,
          "Layers a CompressSession reads, assembles and maps ahead of the layer being "
          "computed (1 .. 64): the pipelining depth, and the bound on buffered layers.");

namespace kvtrim::service {

namespace {

/// Every kvtrimd flag, in --help order.
constexpr const char* kOurFlags[] = {"listen",          "metrics_listen", "port_file",
                                     "max_message_bytes",
                                     "workers",         "max_inflight",
                                     "admission_wait_ms", "max_leases",
                                     "backend",
                                     "numerics",        "drain_timeout_s",
                                     "gpu_memory_limit_bytes", "devices", "http2_window_bytes",
                                     "max_connection_age_s", "max_connection_age_grace_s",
                                     "gpu_launch_graphs",
                                     "tls_cert",        "tls_key",        "tls_client_ca",
                                     "auth_tokens_file", "unix_socket_mode",
                                     "data_dir",        "max_models",     "max_model_bytes",
                                     "allow_client_shm", "max_regions_per_client",
                                     "max_pinned_shm_bytes", "max_layer_bytes",
                                     "session_read_ahead", "session_parallel_layers",
                                     "host_buffer_pool_bytes", "host_buffer_idle_s",
                                     "max_pinned_buffer_bytes"};

/// absl's own usage/flagfile flags: left to absl::ParseCommandLine. The bool says whether
/// the flag takes a value ("--flagfile f" consumes the next argument).
struct UsageFlag {
  const char* name;
  bool takes_value;
};
constexpr UsageFlag kAbslUsageFlags[] = {
    {"helpfull", false}, {"helppackage", false},   {"version", false}, {"only_check_args", false},
    {"helpon", true},    {"helpmatch", true},      {"flagfile", true}, {"fromenv", true},
    {"tryfromenv", true}, {"undefok", true}};

const UsageFlag* FindUsageFlag(absl::string_view name) {
  for (const auto& f : kAbslUsageFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

bool IsHelpArg(absl::string_view arg) {
  return arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" ||
         arg == "-helpshort";
}

/// INVALID_ARGUMENT "--<flag>: '<path>' contains control characters" when `path` has any.
absl::Status CheckPrintable(const char* flag, const std::string& path) {
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", path, "' contains control characters"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must be in [", lo, ", ", hi, "], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

bool BuiltWithCuda() { return KVTRIM_WITH_CUDA != 0; }

std::string KvtrimVersion() { return ReleaseVersion(); }

absl::Status ValidateListenAddress(const std::string& address, const std::string& flag,
                                   bool allow_unix) {
  if (address.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": is empty"));
  for (char c : address) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || !absl::ascii_isprint(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", address, "' contains whitespace or control characters"));
    }
  }
  if (absl::StartsWith(address, "unix:")) {
    if (!allow_unix) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", address, "': unix sockets are not supported here; use HOST:PORT"));
    }
    if (address.size() == 5) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": 'unix:' needs a socket path"));
    }
    return absl::OkStatus();
  }
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", address, "' is not HOST:PORT", allow_unix ? " or unix:PATH" : ""));
  }
  const absl::string_view host = absl::string_view(address).substr(0, colon);
  const absl::string_view port = absl::string_view(address).substr(colon + 1);
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", address, "' has no host"));
  }
  if (absl::StartsWith(host, "[") != absl::EndsWith(host, "]")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", address, "' has an unbalanced IPv6 bracket"));
  }
  if (!absl::StartsWith(host, "[") && host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", address, "': write IPv6 hosts in brackets, e.g. [::1]:50051"));
  }
  int port_number = -1;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &port_number) || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", address, "' needs a port in [0, 65535]"));
  }
  return absl::OkStatus();
}

absl::Status Config::Validate() const {
  KVTRIM_RETURN_IF_ERROR(ValidateListenAddress(listen, "--listen", /*allow_unix=*/true));
  if (!metrics_listen.empty()) {
    KVTRIM_RETURN_IF_ERROR(ValidateListenAddress(metrics_listen, "--metrics_listen", false));
  }
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_message_bytes", max_message_bytes, 1024, INT_MAX));
  KVTRIM_RETURN_IF_ERROR(CheckRange("workers", workers, 1, 1024));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_inflight", max_inflight, 1, 1 << 20));
  KVTRIM_RETURN_IF_ERROR(CheckRange("admission_wait_ms", admission_wait_ms, 0, 60000));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_leases", max_leases, 1, 1 << 20));
  KVTRIM_RETURN_IF_ERROR(CheckRange("http2_window_bytes", http2_window_bytes, 0, 1 << 30));
  KVTRIM_RETURN_IF_ERROR(CheckRange("drain_timeout_s", drain_timeout_s, 0, 86400));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_connection_age_s", max_connection_age_s, 0, 7 * 86400));
  if (auto st = CheckRange("max_connection_age_grace_s", max_connection_age_grace_s, 0, 86400);
      !st.ok()) {
    return st;
  }
  if (gpu_memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu_memory_limit_bytes: must be >= 0 (0 = no cap), got ", gpu_memory_limit_bytes));
  }
  KVTRIM_RETURN_IF_ERROR(CheckRange("gpu_launch_graphs", gpu_launch_graphs, 0, 4096));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_models", max_models, 1, 4096));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_model_bytes", max_model_bytes, 1024, int64_t{1} << 40));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_regions_per_client", max_regions_per_client, 1, 65536));
  KVTRIM_RETURN_IF_ERROR(CheckRange("max_layer_bytes", max_layer_bytes, 1024, int64_t{1} << 40));
  if (auto st = CheckRange("max_pinned_shm_bytes", max_pinned_shm_bytes, 0, int64_t{1} << 44);
      !st.ok()) {
    return st;
  }
  KVTRIM_RETURN_IF_ERROR(CheckRange("session_read_ahead", session_read_ahead, 1, 64));
  KVTRIM_RETURN_IF_ERROR(CheckRange("session_parallel_layers", session_parallel_layers, 1, 16));
  KVTRIM_RETURN_IF_ERROR(CheckRange("host_buffer_idle_s", host_buffer_idle_s, 0, 86400));
  if (auto st = CheckRange("host_buffer_pool_bytes", host_buffer_pool_bytes, 0,
                           int64_t{1} << 40);
      !st.ok()) {
    return st;
  }
  if (auto st = CheckRange("max_pinned_buffer_bytes", max_pinned_buffer_bytes, 0,
                           int64_t{1} << 44);
      !st.ok()) {
    return st;
  }
  KVTRIM_RETURN_IF_ERROR(CheckPrintable("data_dir", data_dir));
  using FlagPath = std::pair<const char*, const std::string*>;
  for (const auto& [flag, path] :
       {FlagPath{"tls_cert", &tls_cert}, FlagPath{"tls_key", &tls_key},
        FlagPath{"tls_client_ca", &tls_client_ca},
        FlagPath{"auth_tokens_file", &auth_tokens_file}}) {
    KVTRIM_RETURN_IF_ERROR(CheckPrintable(flag, *path));
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert / --tls_key: give both (TLS) or neither (plaintext)");
  }
  if (!tls_client_ca.empty() && tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca: mutual TLS needs the server's own --tls_cert and --tls_key");
  }
  KVTRIM_RETURN_IF_ERROR(CheckPrintable("port_file", port_file));
  if (!port_file.empty() && port_file.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--port_file: '", port_file, "' names a directory, not a file"));
  }
  if (backend == BackendKind::kGpu && !BuiltWithCuda()) {
    return absl::InvalidArgumentError(
        "--backend=gpu: this kvtrimd was built without CUDA (KVTRIM_CUDA=OFF); "
        "use --backend=cpu or --backend=auto");
  }
  return absl::OkStatus();
}

std::string Config::ResolvedBackendName(bool gpu_visible) const {
  switch (backend) {
    case BackendKind::kGpu: return "gpu";
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kAuto: return BuiltWithCuda() && gpu_visible ? "gpu" : "cpu";
  }
  return "cpu";
}

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (IsHelpArg(arg)) return true;
  }
  return false;
}

absl::Status ParseCommandLineStrict(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--" || !absl::StartsWith(arg, "-") || arg == "-") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg, "': kvtrimd takes only --flags (see --help)"));
    }
    if (IsHelpArg(arg)) continue;
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    absl::string_view name = arg;
    absl::string_view value;
    bool has_value = false;
    if (const auto eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (const UsageFlag* usage = FindUsageFlag(name)) {
      if (usage->takes_value && !has_value) ++i;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": unknown flag (see kvtrimd --help)"));
    }
    std::string text;
    if (negated) {
      if (has_value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": a negated boolean flag takes no value"));
      }
      text = "false";
    } else if (has_value) {
      text = std::string(value);
    } else if (flag->IsOfType<bool>()) {
      text = "true";
    } else if (i + 1 < argc) {
      text = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
    }
    std::string error;
    if (!flag->ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag->Name(), ": invalid value '", text, "': ", error));
    }
  }
  return absl::OkStatus();
}

std::string UsageText() {
  std::string out = absl::StrCat(
      "Usage: kvtrimd [--flag=value ...]\n\n"
      "kvtrimd ", VersionLine(),
      " - the kvtrim KV-cache eviction sidecar. Serves the kvtrim.v1.Kvtrim gRPC service\n"
      "(plus grpc.health.v1 and server reflection) and exports Prometheus metrics.\n"
      "Exit status: 0 after SIGTERM/SIGINT and a drain; 1 when the server cannot start\n"
      "(address in use, --backend=gpu without a visible CUDA device, failed warm-up);\n"
      "2 for a bad flag; 3 after a sticky CUDA error (health turns NOT_SERVING first).\n\nFlags:\n");
  for (const char* name : kOurFlags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    const bool is_text = flag->IsOfType<std::string>();
    absl::StrAppendFormat(&out, "  --%s=%s\n      %s\n      default: %s\n", flag->Name(),
                          is_text ? "STRING" : "INT", flag->Help(),
                          is_text ? absl::StrCat("\"", flag->DefaultValue(), "\"")
                                  : flag->DefaultValue());
  }
  absl::StrAppend(&out,
                  "\nOther: --help (this text), --helpfull (every flag of every library), "
                  "--version.\n");
  return out;
}

absl::StatusOr<uint32_t> ParseFileMode(const char* flag, const std::string& text) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  uint32_t mode = 0;
  bool ok = !trimmed.empty() && trimmed.size() <= 4;
  for (char c : trimmed) {
    ok = ok && c >= '0' && c <= '7';
    mode = mode * 8 + static_cast<uint32_t>(c - '0');
  }
  if (!ok || mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected an octal mode such "
                                                   "as 0660 (at most 0777), got ",
                                                   QuoteClientText(text)));
  }
  return mode;
}

absl::StatusOr<std::vector<int>> ParseDevices(const std::string& text) {
  std::vector<int> devices;
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  if (trimmed.empty() || trimmed == "all") return devices;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices: '", trimmed.substr(0, 64), trimmed.size() > 64 ? "...'" : "'", " ", why,
        "; give \"all\" or CUDA ordinals such as \"0,2\""));
  };
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    int ordinal = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &ordinal) || ordinal < 0 ||
        ordinal > 1023) {
      return bad(absl::StrCat("has '", part.substr(0, 16), "', not an ordinal in [0, 1023]"));
    }
    if (std::find(devices.begin(), devices.end(), ordinal) != devices.end()) {
      return bad(absl::StrCat("names device ", ordinal, " twice"));
    }
    devices.push_back(ordinal);
    if (devices.size() > 64) return bad("names more than 64 devices");
  }
  return devices;
}

absl::StatusOr<Config> ConfigFromFlags() {
  Config config;
  config.listen = absl::GetFlag(FLAGS_listen);
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.workers = absl::GetFlag(FLAGS_workers);
  config.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  config.admission_wait_ms = absl::GetFlag(FLAGS_admission_wait_ms);
  config.max_leases = absl::GetFlag(FLAGS_max_leases);
  config.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  config.gpu_memory_limit_bytes = absl::GetFlag(FLAGS_gpu_memory_limit_bytes);
  config.gpu_launch_graphs = absl::GetFlag(FLAGS_gpu_launch_graphs);
  config.http2_window_bytes = absl::GetFlag(FLAGS_http2_window_bytes);
  config.max_connection_age_s = absl::GetFlag(FLAGS_max_connection_age_s);
  config.max_connection_age_grace_s = absl::GetFlag(FLAGS_max_connection_age_grace_s);
  auto devices = ParseDevices(absl::GetFlag(FLAGS_devices));
  if (!devices.ok()) return devices.status();
  config.devices = *std::move(devices);
  config.data_dir = absl::GetFlag(FLAGS_data_dir);
  config.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls_key = absl::GetFlag(FLAGS_tls_key);
  config.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  config.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  auto socket_mode = ParseFileMode("unix_socket_mode", absl::GetFlag(FLAGS_unix_socket_mode));
  if (!socket_mode.ok()) return socket_mode.status();
  config.unix_socket_mode = *socket_mode;
  config.max_models = absl::GetFlag(FLAGS_max_models);
  config.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  config.allow_client_shm = absl::GetFlag(FLAGS_allow_client_shm);
  config.max_regions_per_client = absl::GetFlag(FLAGS_max_regions_per_client);
  config.max_pinned_shm_bytes = absl::GetFlag(FLAGS_max_pinned_shm_bytes);
  config.max_layer_bytes = absl::GetFlag(FLAGS_max_layer_bytes);
  config.session_read_ahead = absl::GetFlag(FLAGS_session_read_ahead);
  config.session_parallel_layers = absl::GetFlag(FLAGS_session_parallel_layers);
  config.host_buffer_pool_bytes = absl::GetFlag(FLAGS_host_buffer_pool_bytes);
  config.host_buffer_idle_s = absl::GetFlag(FLAGS_host_buffer_idle_s);
  config.max_pinned_buffer_bytes = absl::GetFlag(FLAGS_max_pinned_buffer_bytes);
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "auto") {
    config.backend = BackendKind::kAuto;
  } else if (backend == "cpu") {
    config.backend = BackendKind::kCpu;
  } else if (backend == "gpu") {
    config.backend = BackendKind::kGpu;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: must be auto, cpu or gpu, got '", backend, "'"));
  }
  const std::string numerics = absl::GetFlag(FLAGS_numerics);
  const std::optional<Numerics> mode = ParseNumerics(numerics);
  if (!mode.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--numerics: must be fast or exact, got '", numerics, "'"));
  }
  config.numerics = *mode;
  KVTRIM_RETURN_IF_ERROR(config.Validate());
  return config;
}

}  // namespace kvtrim::service
