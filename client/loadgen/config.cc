#include "client/loadgen/config.h"

#include "absl/strings/str_cat.h"

namespace kvtrim::loadgen {

absl::StatusOr<Transport> ParseTransport(const std::string& text) {
  if (text == "inline") return Transport::kInline;
  if (text == "host_shm") return Transport::kHostShm;
  if (text == "cuda_ipc") return Transport::kCudaIpc;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport: \"", text, "\" is not one of inline, host_shm, cuda_ipc"));
}

const char* TransportName(Transport transport) {
  switch (transport) {
    case Transport::kInline:
      return "inline";
    case Transport::kHostShm:
      return "host_shm";
    case Transport::kCudaIpc:
      return "cuda_ipc";
  }
  return "?";
}

absl::StatusOr<v1::DType> ParseDType(const std::string& text) {
  if (text == "bf16") return v1::DTYPE_BF16;
  if (text == "f16") return v1::DTYPE_F16;
  if (text == "f32") return v1::DTYPE_F32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype: \"", text, "\" is not one of bf16, f16, f32"));
}

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_F16:
      return "f16";
    case v1::DTYPE_F32:
      return "f32";
    default:
      return "?";
  }
}

int DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
    case v1::DTYPE_F16:
      return 2;
    case v1::DTYPE_F32:
      return 4;
    default:
      return 0;
  }
}

absl::Status ValidateConfig(const LoadgenConfig& c) {
  auto bad = [](const char* flag, const auto& value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", value, " ", rule));
  };
  if (c.target.empty()) return absl::InvalidArgumentError("--target: must not be empty");
  if (c.policy.empty()) return absl::InvalidArgumentError("--policy: must not be empty");
  if (!(c.keep_fraction > 0 && c.keep_fraction <= 1)) {
    return bad("keep_fraction", c.keep_fraction, "is not in (0, 1]");
  }
  if (c.layers < 1) return bad("layers", c.layers, "must be >= 1");
  if (c.tokens < 1) return bad("tokens", c.tokens, "must be >= 1");
  if (c.kv_heads < 1) return bad("kv_heads", c.kv_heads, "must be >= 1");
  if (c.q_heads < 1 || c.q_heads % c.kv_heads != 0) {
    return bad("q_heads", c.q_heads, "must be a positive multiple of --kv_heads");
  }
  if (c.head_dim < 1) return bad("head_dim", c.head_dim, "must be >= 1");
  if (c.window < 1 || c.window > c.tokens) {
    return bad("window", c.window, "must be in [1, --tokens]");
  }
  if (DTypeBytes(c.dtype) == 0) return absl::InvalidArgumentError("--dtype: unspecified");
  if (c.workers < 1) return bad("workers", c.workers, "must be >= 1");
  if (c.prefills < 1) return bad("prefills", c.prefills, "must be >= 1");
  if (c.warmup_prefills < 0) return bad("warmup_prefills", c.warmup_prefills, "must be >= 0");
  if (c.chunk_bytes < 0) return bad("chunk_bytes", c.chunk_bytes, "must be >= 0");
  if (c.device < 0) return bad("device", c.device, "must be >= 0");
  if (c.max_message_bytes <= 0) {
    return bad("max_message_bytes", c.max_message_bytes, "must be positive");
  }
  if (c.transport == Transport::kInline && c.chunk_bytes > 0 &&
      c.chunk_bytes > c.max_message_bytes - (64 << 10)) {
    return bad("chunk_bytes", c.chunk_bytes,
               "must leave 64 KiB of --max_message_bytes for the message's other fields");
  }
  if (!(c.timeout_s > 0)) return bad("timeout_s", c.timeout_s, "must be positive");
  if (c.http2_window_bytes < 0) {
    return bad("http2_window_bytes", c.http2_window_bytes, "must be >= 0");
  }
  if (c.output_region && c.transport != Transport::kCudaIpc) {
    return absl::InvalidArgumentError("--output_region: needs --transport=cuda_ipc");
  }
  return absl::OkStatus();
}

absl::StatusOr<PolicyNeeds> NeedsOfPolicy(const v1::ListPoliciesResponse& policies,
                                          const std::string& name, bool include_optional,
                                          bool model_given) {
  for (const v1::PolicyInfo& info : policies.policies()) {
    if (info.name() != name) continue;
    PolicyNeeds needs;
    for (int input : info.inputs()) {
      if ((input == v1::POLICY_INPUT_MODEL || input == v1::POLICY_INPUT_PROFILE) &&
          !model_given) {
        return absl::UnimplementedError(absl::StrCat(
            "--policy: \"", name,
            "\" requires a registered model or profile: register one (kvtrim register-model) "
            "and pass its digest as --model_digest"));
      }
    }
    for (const auto* list : {&info.inputs(), &info.optional_inputs()}) {
      if (list == &info.optional_inputs() && !include_optional) continue;
      for (int input : *list) {
        if (input == v1::POLICY_INPUT_VALUES) needs.values = true;
        if (input == v1::POLICY_INPUT_QUERIES) needs.queries = true;
      }
    }
    needs.model_wide = info.scope() == v1::DECISION_SCOPE_MODEL;
    return needs;
  }
  return absl::NotFoundError(absl::StrCat("--policy: the server lists no policy \"", name, "\""));
}

}  // namespace kvtrim::loadgen
