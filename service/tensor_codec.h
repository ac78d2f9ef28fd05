// Decoding of proto tensors and layers into kernel views, with the proto-level checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "kernels/layer.h"
#include "kernels/tensor.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::service {

/// Which tensor of a layer is decoded; names the dimensions in error messages.
enum class TensorRole {
  kKeys,     // [H_kv, n, d]
  kValues,   // [H_kv, n, d]
  kQueries,  // [H_q, w, d]
};

/// Byte buffers the decoder had to copy (inline bytes that were not aligned to their
/// element size). Views returned by the decoder may point into these; keep them alive.
using OwnedBuffers = std::vector<std::vector<uint32_t>>;

/// Decodes one proto Tensor into a view over its inline bytes (no copy unless misaligned).
/// Checks, all INVALID_ARGUMENT naming `field` + sub-field unless noted:
///   dtype set and known ("<field>.dtype"); rank 3 ("<field>.shape"); every dimension >= 1
///   and within `limits` ("<field>.shape[i]"); inline byte length == product(shape) *
///   sizeof(dtype) ("<field>.inline_data"); data present ("<field>.inline_data");
///   host_shm / cuda_ipc -> UNIMPLEMENTED naming "<field>.host_shm" / "<field>.cuda_ipc".
/// The returned view aliases `tensor` (or `owned`): both must outlive it.
absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, TensorRole role,
                                        const EngineLimits& limits, const std::string& field,
                                        OwnedBuffers* owned);

/// A decoded layer: the kernel request plus the storage its views may point into.
struct DecodedLayer {
  LayerRequest request;      // views alias the proto message or `owned`
  OwnedBuffers owned;        // copies of misaligned inline data
  int64_t tensor_bytes = 0;  // bytes of tensor data received for this layer
};

/// Decodes one LayerInput: layer_id >= 0 ("<field>.layer_id"), keys required
/// ("<field>.keys"), values and queries optional, softmax_scale finite and >= 0
/// ("<field>.softmax_scale"), every present tensor through DecodeTensor. Cross-tensor
/// checks (matching dims, GQA, NaN/Inf) are the engine's. `input` must outlive `out`.
absl::Status DecodeLayer(const v1::LayerInput& input, const EngineLimits& limits,
                         const std::string& field, DecodedLayer* out);

/// Sum of the inline tensor bytes of `input` (for kvtrim_request_bytes_total), counted
/// before any validation.
int64_t InlineTensorBytes(const v1::LayerInput& input);

}  // namespace kvtrim::service
