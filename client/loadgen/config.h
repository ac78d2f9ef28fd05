// The load generator's configuration (from its flags) and what the chosen policy needs.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::loadgen {

/// How a layer's tensors reach kvtrimd.
enum class Transport {
  kInline,   // bytes inside the session messages (chunked per LoadgenConfig::chunk_bytes)
  kHostShm,  // RegionSlices into one POSIX shared-memory segment
  kCudaIpc,  // RegionSlices into one cudaMalloc buffer exported by CUDA IPC
};

/// "inline" | "host_shm" | "cuda_ipc"; INVALID_ARGUMENT naming --transport otherwise.
absl::StatusOr<Transport> ParseTransport(const std::string& text);
/// The flag spelling of `transport`.
const char* TransportName(Transport transport);

/// "bf16" | "f16" | "f32"; INVALID_ARGUMENT naming --dtype otherwise.
absl::StatusOr<v1::DType> ParseDType(const std::string& text);
/// The flag spelling of `dtype` ("?" for an unspecified one).
const char* DTypeName(v1::DType dtype);
/// Bytes per element of `dtype` (0 for an unspecified one).
int DTypeBytes(v1::DType dtype);

/// One load generator run: the server, the transport, the model's shapes and the load.
struct LoadgenConfig {
  std::string target = "localhost:50051";
  Transport transport = Transport::kInline;
  std::string policy = "dropkv";
  double keep_fraction = 0.2;
  int32_t layers = 32;     // L
  int64_t tokens = 32768;  // n
  int32_t kv_heads = 8;    // H_kv
  int32_t q_heads = 32;    // H_q
  int32_t head_dim = 128;  // d
  int32_t window = 32;     // w
  v1::DType dtype = v1::DTYPE_BF16;
  int32_t workers = 1;                   // concurrent workers (threads), each with its own channel
  int32_t prefills = 3;                  // measured prefills per worker
  int32_t warmup_prefills = 1;           // unmeasured prefills per worker before the measured ones
  int64_t chunk_bytes = 4 << 20;         // inline: session chunk size (0 = unchunked messages)
  bool send_optional = false;            // also send the policy's optional inputs
  bool serial = false;                   // wait for each layer's answer before the next
  uint64_t seed = 0;                     // data generator seed (also the settings' seed)
  int32_t device = 0;                    // cuda_ipc: CUDA device ordinal
  int32_t max_message_bytes = 64 << 20;  // channel's message cap
  double timeout_s = 600;                // deadline of each session stream
  bool rewrite_per_layer = false;        // host_shm: copy the layer into the segment per layer
  bool output_region = false;            // cuda_ipc: the lists go to a device output region
  int32_t http2_window_bytes = 0;        // channel's HTTP/2 window (0 = gRPC's defaults)
  std::string model_digest;              // settings.model_digest (model-aware policies)
  bool shared_connection = false;        // workers share one connection (gRPC's default)
  std::string json_out;                  // "" = no JSON file
  v1::Numerics numerics = v1::NUMERICS_UNSPECIFIED;  // asked for; unspecified = server default
  bool packed_answer = true;             // answer_encoding PACKED (false: REPEATED)
  bool profile = true;                   // settings.profile: per-stage times of each layer
  v1::Perturbation perturbation = v1::PERTURBATION_FULL;  // settings.perturbation
};

/// OK when every field is in range; INVALID_ARGUMENT naming the flag otherwise.
absl::Status ValidateConfig(const LoadgenConfig& config);

/// What the policy needs on the wire, from its ListPolicies entry.
struct PolicyNeeds {
  bool values = false;      // POLICY_INPUT_VALUES required (or optional, when asked)
  bool queries = false;     // POLICY_INPUT_QUERIES required (or optional, when asked)
  bool model_wide = false;  // DECISION_SCOPE_MODEL: every layer is answered at finish
};

/// The needs of policy `name` as `policies` lists it: its required inputs, plus its
/// optional ones (e.g. values for the perturbation statistic) when `include_optional`, so
/// key-only policies put no values on the wire by default. NOT_FOUND naming --policy when it
/// is not listed; UNIMPLEMENTED when it requires a registered model or profile and no
/// `model_given` (--model_digest: the load generator registers none itself).
absl::StatusOr<PolicyNeeds> NeedsOfPolicy(const v1::ListPoliciesResponse& policies,
                                          const std::string& name, bool include_optional = false,
                                          bool model_given = false);

}  // namespace kvtrim::loadgen
