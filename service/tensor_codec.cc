#include "service/tensor_codec.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtrim::service {

namespace {

/// Names of the three dimensions of a tensor role, for messages.
const char* DimName(TensorRole role, int dim) {
  static const char* const kKv[] = {"H_kv", "n", "d"};
  static const char* const kQ[] = {"H_q", "w", "d"};
  return role == TensorRole::kQueries ? kQ[dim] : kKv[dim];
}

/// Upper bound of dimension `dim` of a tensor role from the engine limits.
int64_t DimLimit(TensorRole role, int dim, const EngineLimits& limits) {
  switch (dim) {
    case 0: return limits.max_heads;
    case 1: return role == TensorRole::kQueries ? limits.max_window_rows : limits.max_tokens;
    default: return limits.max_head_dim;
  }
}

absl::StatusOr<DType> DecodeDType(v1::DType dtype, const std::string& field) {
  switch (dtype) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_F16: return DType::kF16;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: DTYPE_UNSPECIFIED; set DTYPE_F32, DTYPE_F16 or DTYPE_BF16"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: unknown dtype ", static_cast<int>(dtype),
          "; expected DTYPE_F32, DTYPE_F16 or DTYPE_BF16"));
  }
}

}  // namespace

absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, TensorRole role,
                                        const EngineLimits& limits, const std::string& field,
                                        OwnedBuffers* owned) {
  switch (tensor.data_case()) {
    case v1::Tensor::kHostShm:
      return absl::UnimplementedError(absl::StrCat(
          field, ".host_shm: shared-memory tensors arrive in a later release; send inline_data"));
    case v1::Tensor::kCudaIpc:
      return absl::UnimplementedError(absl::StrCat(
          field, ".cuda_ipc: CUDA IPC tensors arrive in a later release; send inline_data"));
    default:
      break;
  }
  auto dtype = DecodeDType(tensor.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  if (tensor.shape_size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape: expected rank 3 [", DimName(role, 0), ", ", DimName(role, 1), ", ",
        DimName(role, 2), "], got rank ", tensor.shape_size(), " [",
        absl::StrJoin(tensor.shape(), ", "), "]"));
  }
  TensorView view;
  view.dtype = *dtype;
  for (int i = 0; i < 3; ++i) {
    const int64_t dim = tensor.shape(i);
    if (dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape[", i, "]: ", DimName(role, i),
                                                     " must be >= 1, got ", dim));
    }
    const int64_t limit = DimLimit(role, i, limits);
    if (dim > limit) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape[", i, "]: ", DimName(role, i),
                                                     "=", dim, " exceeds the limit ", limit));
    }
    view.shape[i] = dim;
  }
  if (tensor.data_case() != v1::Tensor::kInlineData) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".inline_data: no tensor data; set inline_data"));
  }
  // Reject products that would overflow int64 before comparing byte lengths.
  const long double product = static_cast<long double>(view.shape[0]) * view.shape[1] *
                              view.shape[2] * static_cast<long double>(DTypeSize(view.dtype));
  if (product > static_cast<long double>(int64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: [",
                                                   absl::StrJoin(view.shape, ", "),
                                                   "] is too large"));
  }
  const std::string& bytes = tensor.inline_data();
  if (static_cast<int64_t>(bytes.size()) != view.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".inline_data: ", bytes.size(), " bytes, but shape [",
        absl::StrJoin(view.shape, ", "), "] x ", DTypeSize(view.dtype), "-byte ",
        DTypeName(view.dtype), " needs ", view.nbytes()));
  }
  const auto address = reinterpret_cast<uintptr_t>(bytes.data());
  if (address % DTypeSize(view.dtype) != 0) {
    // Misaligned inline bytes: copy into word-aligned storage.
    owned->emplace_back((bytes.size() + 3) / 4);
    std::memcpy(owned->back().data(), bytes.data(), bytes.size());
    view.data = owned->back().data();
  } else {
    view.data = bytes.data();
  }
  return view;
}

absl::Status DecodeLayer(const v1::LayerInput& input, const EngineLimits& limits,
                         const std::string& field, DecodedLayer* out) {
  out->tensor_bytes = InlineTensorBytes(input);
  if (input.layer_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".layer_id: must be >= 0, got ", input.layer_id()));
  }
  if (!std::isfinite(input.softmax_scale()) || input.softmax_scale() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".softmax_scale: must be finite and >= 0 (0 = 1/sqrt(d)), got ",
        input.softmax_scale()));
  }
  if (!input.has_keys()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".keys: required [H_kv, n, d]"));
  }
  LayerRequest& request = out->request;
  request.layer_id = input.layer_id();
  request.softmax_scale = input.softmax_scale();
  auto keys = DecodeTensor(input.keys(), TensorRole::kKeys, limits, field + ".keys", &out->owned);
  if (!keys.ok()) return keys.status();
  request.keys = *keys;
  if (input.has_values()) {
    auto values =
        DecodeTensor(input.values(), TensorRole::kValues, limits, field + ".values", &out->owned);
    if (!values.ok()) return values.status();
    request.values = *values;
  }
  if (input.has_queries()) {
    auto queries = DecodeTensor(input.queries(), TensorRole::kQueries, limits,
                                field + ".queries", &out->owned);
    if (!queries.ok()) return queries.status();
    request.queries = *queries;
  }
  return absl::OkStatus();
}

int64_t InlineTensorBytes(const v1::LayerInput& input) {
  int64_t total = 0;
  if (input.has_keys()) total += static_cast<int64_t>(input.keys().inline_data().size());
  if (input.has_values()) total += static_cast<int64_t>(input.values().inline_data().size());
  if (input.has_queries()) total += static_cast<int64_t>(input.queries().inline_data().size());
  return total;
}

}  // namespace kvtrim::service
