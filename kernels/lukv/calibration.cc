#include "kernels/lukv/calibration.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvtrim::lukv {
namespace {

absl::Status CheckTensor(const F32Tensor& t, const std::array<int64_t, 3>& shape,
                         const std::string& name) {
  if (!t.present()) return absl::InvalidArgumentError(absl::StrCat(name, ": missing"));
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": shape [", t.dim(0), ", ", t.dim(1),
                                                   ", ", t.dim(2), "], expected [", shape[0],
                                                   ", ", shape[1], ", ", shape[2], "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CalibrationDims::Validate(const std::string& source) const {
  if (num_layers < 1 || num_kv_heads < 1 || num_query_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": L, H_kv, H_q and d must be positive, got L=", num_layers, " H_kv=",
        num_kv_heads, " H_q=", num_query_heads, " d=", head_dim));
  }
  if (num_query_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": H_q=", num_query_heads,
                                                   " is not a multiple of H_kv=", num_kv_heads));
  }
  if (!(1 <= context_length && context_length <= decode_start && decode_start < num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": need 1 <= context_length <= decode_start < N, got context_length=",
        context_length, " decode_start=", decode_start, " N=", num_tokens));
  }
  return absl::OkStatus();
}

absl::Status CalibrationDump::Validate() const {
  KVTRIM_RETURN_IF_ERROR(dims.Validate(source));
  const size_t L = static_cast<size_t>(dims.num_layers);
  if (keys.size() != L || values.size() != L || queries.size() != L) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected keys, values and queries for ", L, " layers"));
  }
  const std::array<int64_t, 3> kv{dims.num_kv_heads, dims.num_tokens, dims.head_dim};
  const std::array<int64_t, 3> q{dims.num_query_heads, dims.num_tokens, dims.head_dim};
  for (size_t l = 0; l < L; ++l) {
    const std::string prefix = absl::StrCat(source, ": layers.", l);
    KVTRIM_RETURN_IF_ERROR(CheckTensor(keys[l], kv, prefix + ".keys"));
    KVTRIM_RETURN_IF_ERROR(CheckTensor(values[l], kv, prefix + ".values"));
    KVTRIM_RETURN_IF_ERROR(CheckTensor(queries[l], q, prefix + ".queries"));
  }
  return absl::OkStatus();
}

absl::Status ModelWeights::Validate() const {
  if (num_layers < 1 || num_kv_heads < 1 || num_query_heads < 1 || head_dim < 1 ||
      hidden_size < 1 || num_query_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", name, "': bad layout L=", num_layers, " H_q=", num_query_heads,
        " H_kv=", num_kv_heads, " d=", head_dim, " D=", hidden_size));
  }
  if (w_o.size() != static_cast<size_t>(num_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name, "': expected w_o for ", num_layers, " layers"));
  }
  for (size_t l = 0; l < w_o.size(); ++l) {
    if (auto st = CheckTensor(w_o[l], {1, hidden_size, num_query_heads * head_dim},
                              absl::StrCat("model '", name, "': layers.", l, ".w_o"));
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status ModelWeights::CheckMatches(const CalibrationDims& dims,
                                        const std::string& source) const {
  if (dims.num_layers != num_layers || dims.num_kv_heads != num_kv_heads ||
      dims.num_query_heads != num_query_heads || dims.head_dim != head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": L=", dims.num_layers, " H_kv=", dims.num_kv_heads, " H_q=",
        dims.num_query_heads, " d=", dims.head_dim, " do not match model '", name, "' (L=",
        num_layers, " H_kv=", num_kv_heads, " H_q=", num_query_heads, " d=", head_dim, ")"));
  }
  return absl::OkStatus();
}

}  // namespace kvtrim::lukv
