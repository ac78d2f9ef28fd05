// What one layer request carries into a backend, and what a backend answers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/budget.h"
#include "kernels/params.h"
#include "kernels/policy_kind.h"
#include "kernels/tensor.h"

namespace kvtrim {

/// Shape of the answer for one layer.
///  kPerHead     one ascending list per KV head (lengths may differ with ragged allocators)
///  kShared      one list for all heads: heads' rankings merged round-robin
///  kBlockAligned one list for all heads made of whole blocks of `block_size` tokens
///  kEqualCount  one list per head, every head of every layer keeps exactly the uniform k
enum class OutputShape { kPerHead, kShared, kBlockAligned, kEqualCount };

/// Settings shared by every layer of a request or session (proto CompressionSettings).
struct CompressionSettings {
  std::string policy;                          // preset or "SCORER+ALLOCATOR"
  std::map<std::string, ParamValue> params;    // parameter overrides
  Budget budget;
  std::optional<int64_t> sink_tokens;          // unset = policy default
  std::optional<int64_t> recent_tokens;        // unset = policy default
  OutputShape output_shape = OutputShape::kPerHead;
  int32_t num_layers = 0;                      // 0 = unknown (max layer id + 1)
  uint64_t seed = 0;
  int32_t block_size = 0;                      // kBlockAligned: tokens per block (>= 1)
  std::string model_digest;                    // registered model, or empty
  /// Numerics asked for (the service fills the server default --numerics when the request
  /// leaves it unspecified). A backend without a fast path for the policy computes exact
  /// and says so in LayerDecision::numerics.
  Numerics numerics = Numerics::kFast;
  /// Whether the output perturbation statistic is computed (when values and queries are
  /// present): proto Perturbation FULL / SAMPLED (true) or OFF (false).
  bool perturbation = true;
  /// SAMPLED: in fast numerics the statistic averages the last kSampledPerturbationRows
  /// window rows of every query head only (exact numerics: every row).
  bool perturbation_sampled = false;
  /// Whether answers carry the kept lists as packed little-endian bytes (proto
  /// answer_encoding PACKED, LayerResult.packed) rather than repeated fields.
  bool packed_answer = false;
  /// Whether each LayerDecision carries its per-stage times (proto settings.profile).
  bool profile = false;
};

/// Where a layer's kept lists go instead of the answer (proto LayerInput.output): the CSR
/// int64 offsets [L + 1] then int32 indices, from `device` (a device target, written by the
/// GPU backend) or from a host target the service writes.
struct OutputTarget {
  bool present = false;    // the request names an output region
  uint64_t capacity = 0;   // bytes from the target's start to its region's end
  void* device = nullptr;  // device targets: the mapped address (8-byte aligned); else null
  void* done_event = nullptr;  // device targets: a cudaEvent_t recorded after the write, or null
};

/// Bytes an output target needs for `lists` lists over `n` tokens: 8 (L + 1) + 4 L n.
inline uint64_t OutputTargetBytes(int64_t lists, int64_t n) {
  return 8 * static_cast<uint64_t>(lists + 1) +
         4 * static_cast<uint64_t>(lists) * static_cast<uint64_t>(n);
}

/// The raw tensors of one layer, as received (any dtype, not yet validated).
struct LayerRequest {
  int32_t layer_id = 0;
  TensorView keys;     // [H_kv, n, d]
  TensorView values;   // [H_kv, n, d] or absent
  TensorView queries;  // [H_q, w, d] or absent
  float softmax_scale = 0;  // 0 = 1/sqrt(d)
  /// Device tensors only: a cudaEvent_t (opaque here) the backend's stream waits on before
  /// reading them (the worker's IPC event), or null.
  void* ready_event = nullptr;
  /// Where the kept lists go instead of the answer (not present: the answer carries them).
  OutputTarget output;
};

/// Dimensions of a validated layer.
struct LayerShape {
  int64_t num_kv_heads = 0;     // H_kv
  int64_t num_tokens = 0;       // n
  int64_t head_dim = 0;         // d
  int64_t num_query_heads = 0;  // H_q (0 without queries)
  int64_t window_rows = 0;      // w (0 without queries)
  bool has_values = false;
  bool has_queries = false;
  /// G = H_q / H_kv (0 without queries).
  int64_t group_size() const { return num_kv_heads ? num_query_heads / num_kv_heads : 0; }
};

/// A validated layer handed to a backend: raw views plus the derived shape and scalars.
struct ValidatedLayer {
  int32_t layer_id = 0;
  int32_t num_layers = 1;   // L, >= layer_id + 1
  LayerShape shape;
  TensorView keys;          // [H_kv, n, d]
  TensorView values;        // [H_kv, n, d] or absent
  TensorView queries;       // [H_q, w, d] or absent
  float softmax_scale = 0;  // resolved (never 0)
  uint64_t seed = 0;
  void* ready_event = nullptr;  // as LayerRequest::ready_event
  OutputTarget output;          // as LayerRequest::output (capacity checked)
  /// Non-empty when the engine left the keys' NaN / Inf scan to the backend
  /// (Backend::ChecksKeysFinite): the field its error names, e.g. "layers[2].keys".
  std::string unchecked_keys_field;
  /// True when any present tensor lives in device memory.
  bool has_device_tensors() const {
    return keys.on_device() || values.on_device() || queries.on_device();
  }
};

/// The per-head budget of a layer after rules 2 and 3.
struct LayerBudget {
  int64_t kept_per_head = 0;   // uniform k before any allocator
  Protection protection;       // clamped protected counts (identical for every head)
  Protection requested;        // protection before rule 3 (per-head clamps, e.g. lukv)
};

/// Window rows per query head of the sampled perturbation statistic (fast numerics).
constexpr int32_t kSampledPerturbationRows = 8;

/// Where one layer's time went, in seconds (proto LayerProfile; 0 for a stage that did not
/// run). The backend fills worker_wait .. fetch, the service the rest.
struct LayerProfile {
  double server = 0;        // first byte read -> answer encoded
  double decode = 0;        // tensors decoded (chunks, regions, shm)
  double validate = 0;      // the engine's checks
  double queued = 0;        // waiting behind earlier layers of the session
  double worker_wait = 0;   // waiting for a device worker
  double plan = 0;          // plan and memory reservations
  double stage = 0;         // inputs onto the device, host wall clock
  double ready_wait = 0;    // device: waiting on the client's ready event
  double stage_device = 0;  // device: uploads, gathers
  double score = 0;         // device (CPU backend: host): the scorer
  double select = 0;        // device (CPU backend: host): allocation and selection
  double perturbation = 0;  // device (CPU backend: host): the perturbation statistic
  double download = 0;      // device: the answer's copy to the host
  double fetch = 0;         // the host's wait for the device and the decision assembled
  double encode = 0;        // the answer encoded
};

/// The decision for one layer: kept indices in CSR form plus per-head statistics.
struct LayerDecision {
  int32_t layer_id = 0;
  int64_t num_tokens = 0;
  OutputShape output_shape = OutputShape::kPerHead;
  std::vector<int64_t> offsets;       // [H_kv + 1] per head, or [2] shared
  std::vector<int32_t> indices;       // ascending within each list; empty when output_written
  std::vector<int32_t> kept_per_head; // [H_kv]
  std::vector<double> perturbation;   // [H_kv], empty when values or queries are absent
  int32_t perturbation_rows = 0;      // window rows per query head it averaged (0: none)
  bool perturbation_sampled = false;  // fewer rows than the window (PERTURBATION_SAMPLED)
  double compute_seconds = 0;
  Numerics numerics = Numerics::kExact;  // the mode that computed the scores
  /// Per-stage times, filled when CompressionSettings::profile was set.
  LayerProfile profile;
  /// The lists went to the layer's output target (indices empty; offsets and
  /// kept_per_head stay).
  bool output_written = false;
  /// The CUDA device ordinal that computed the layer (-1: the CPU backend).
  int32_t device = -1;
};

}  // namespace kvtrim
