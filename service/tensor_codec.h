// Decoding of proto tensors and layers into kernel views, with the proto-level checks, for
// every transport: inline bytes, session chunks, host shared memory and CUDA IPC regions.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/engine.h"
#include "kernels/layer.h"
#include "kernels/tensor.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "service/host_buffer_pool.h"
#include "service/region_registry.h"

namespace kvtrim::service {

/// The kernels' dtype of a proto dtype; INVALID_ARGUMENT "<field>.dtype: ..." for
/// DTYPE_UNSPECIFIED or a value outside the enum.
absl::StatusOr<DType> DecodeDType(v1::DType dtype, const std::string& field);

/// Which tensor of a layer is decoded; names the dimensions in error messages.
enum class TensorRole {
  kKeys,     // [H_kv, n, d]
  kValues,   // [H_kv, n, d]
  kQueries,  // [H_q, w, d]
};

/// Byte buffers the decoder filled (misaligned inline bytes, host shm reads, assembled
/// chunks). Views returned by the decoder may point into these; keep them alive.
/// Each buffer is uninitialised uint32 words (word-aligned bytes), from the service's
/// HostBufferPool when it has one (given back when the layer is done), else the heap.
using OwnedBuffers = std::vector<HostBuffer>;

/// Appends an uninitialised buffer of at least `bytes` bytes to `owned` (from `pool`, or the
/// heap when null); returns it.
inline char* NewOwnedBuffer(OwnedBuffers* owned, size_t bytes,
                            const std::shared_ptr<HostBufferPool>& pool = nullptr) {
  owned->push_back(AcquireHostBuffer(pool, bytes));
  return reinterpret_cast<char*>(owned->back().get());
}

/// Bytes of tensor data a layer carried, per transport (metrics).
struct TransportBytes {
  int64_t inline_bytes = 0;  // inline_data and session chunks
  int64_t host_shm = 0;      // read from shared-memory regions
  int64_t cuda_ipc = 0;      // read in place from CUDA IPC regions
};

/// What decoding needs beyond the message itself.
struct DecodeContext {
  /// The registered regions; null: region tensors are FAILED_PRECONDITION.
  const RegionRegistry* regions = nullptr;
  /// The call's kvtrim-client-id metadata ("" when absent).
  std::string client_id;
  /// A session's assembled chunked tensors of this layer (keys, values, queries), each
  /// product(shape) * sizeof(dtype) bytes; null: `chunked` tensors are refused.
  std::array<const uint32_t*, 3> chunks{};
  /// Which of `chunks` are page-locked for the devices: their views are kPinnedHost (the
  /// device copies them by DMA and checks them for NaN / Inf; the host reads none).
  std::array<bool, 3> chunks_page_locked{};
  /// Where host shm reads and misaligned copies go (null: the heap).
  std::shared_ptr<HostBufferPool> buffers;
  /// Most bytes one host shm tensor may be read into host memory (--max_layer_bytes, as
  /// chunked layers are capped); RESOURCE_EXHAUSTED above. Page-locked segments, which the
  /// device copies without a host read, are not capped here.
  int64_t max_host_read_bytes = int64_t{8} << 30;
};

/// Decodes one proto Tensor into a view. Checks, all INVALID_ARGUMENT naming `field` +
/// sub-field unless noted: dtype set and known ("<field>.dtype"); rank 3 ("<field>.shape");
/// every dimension >= 1 and within `limits` ("<field>.shape[i]"); data present;
///  inline_data: byte length == product(shape) * sizeof(dtype) ("<field>.inline_data");
///    aliases `tensor` (copied into `owned` only when misaligned)
///  chunked: total_bytes equal to it ("<field>.chunked.total_bytes"), a session's
///    assembled bytes (refused outside sessions); aliases the assembled buffer (a
///    kPinnedHost view when the buffer is page-locked)
///  host_shm / cuda_ipc: the region (RegionRegistry::Acquire: NOT_FOUND,
///    PERMISSION_DENIED, FAILED_PRECONDITION), strides ("<field>.<kind>.strides_elements"),
///    paging ("<field>.<kind>.paged...") and bounds ("<field>.<kind>.offset_bytes": every
///    addressed element inside the region, offset a multiple of the element size);
///    host_shm is a kPinnedHost view into the segment's mapping when the registry
///    page-locked the segment and the tensor is dense (the device copies it; nothing on
///    the host reads it), else read into `owned` (dense); cuda_ipc is a device view in
///    place (with a StridedLayout unless dense). The region stays pinned through `pins`.
absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, TensorRole role,
                                        const EngineLimits& limits, const std::string& field,
                                        const DecodeContext& context, OwnedBuffers* owned,
                                        std::vector<RegionPin>* pins, TransportBytes* bytes);

/// DecodeTensor without regions or chunks (unit tests, unary paths without a context).
absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, TensorRole role,
                                        const EngineLimits& limits, const std::string& field,
                                        OwnedBuffers* owned);

/// product(shape) * sizeof(dtype) of a tensor after the dtype and shape checks of
/// DecodeTensor (a session sizes chunk assembly with it before any byte arrives).
absl::StatusOr<int64_t> TensorByteSize(const v1::Tensor& tensor, TensorRole role,
                                       const EngineLimits& limits, const std::string& field);

/// A decoded layer: the kernel request plus the storage and regions its views use.
/// A host_shm output region of a layer (LayerInput.output.host_shm): where the service
/// writes the kept lists (WriteHostOutput) before it answers.
struct HostOutput {
  RegionPin region;     // pinned until the layer is answered
  uint64_t offset = 0;  // bytes into the region
};

struct DecodedLayer {
  LayerRequest request;        // views alias the proto message, `owned` or regions
  std::optional<HostOutput> host_output;  // a host_shm output region (request.output set)
  OwnedBuffers owned;          // copies (misaligned inline data, host shm reads, chunks)
  std::vector<RegionPin> pins; // regions read by this layer, pinned until it is answered
  TransportBytes transport;    // bytes per transport
  int64_t tensor_bytes = 0;    // bytes of tensor data received inline for this layer
};

/// Decodes one LayerInput: layer_id >= 0 ("<field>.layer_id"), keys required
/// ("<field>.keys"), values and queries optional, softmax_scale finite and >= 0
/// ("<field>.softmax_scale"), ready_event_id a cuda_ipc_event region of the client
/// ("<field>.ready_event_id"), `output` a host_shm or cuda_ipc region slice of the client
/// without strides or paging, 8-byte aligned, with done_event_id only on cuda_ipc
/// ("<field>.output..."; its capacity is the engine's check), every present tensor
/// through DecodeTensor. Cross-tensor
/// checks (matching dims, GQA, NaN/Inf) are the engine's. `input` must outlive `out`.
absl::Status DecodeLayer(const v1::LayerInput& input, const EngineLimits& limits,
                         const std::string& field, const DecodeContext& context,
                         DecodedLayer* out);

/// Writes `decision`'s kept lists (int64 offsets, then int32 indices) into the layer's
/// host_shm output region and marks the decision output_written (its indices released).
/// INVALID_ARGUMENT / FAILED_PRECONDITION naming "<field>.output.host_shm".
absl::Status WriteHostOutput(const HostOutput& output, const std::string& field,
                             LayerDecision* decision);

/// Sum of the inline tensor bytes of `input` (for kvtrim_request_bytes_total), counted
/// before any validation.
int64_t InlineTensorBytes(const v1::LayerInput& input);

}  // namespace kvtrim::service
