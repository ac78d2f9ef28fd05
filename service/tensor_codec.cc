#include "service/tensor_codec.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "kernels/engine.h"

namespace kvtrim::service {

/// Returns from the enclosing function when the absl::Status expression fails.
#define KVTRIM_RETURN_IF_ERROR_STATUS(expr)        \
  do {                                               \
    ::absl::Status kvtrim_status_ = (expr);          \
    if (!kvtrim_status_.ok()) return kvtrim_status_; \
  } while (false)

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


/// The dtype and shape checks shared by every transport; fills view.dtype and view.shape.
absl::Status DecodeHeader(const v1::Tensor& tensor, TensorRole role, const EngineLimits& limits,
                          const std::string& field, TensorView* view) {
  auto dtype = DecodeDType(tensor.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  if (tensor.shape_size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape: expected rank 3 [", DimName(role, 0), ", ", DimName(role, 1), ", ",
        DimName(role, 2), "], got rank ", tensor.shape_size(), " [",
        absl::StrJoin(tensor.shape(), ", "), "]"));
  }
  view->dtype = *dtype;
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
    view->shape[i] = dim;
  }
  // Reject products that would overflow int64 before comparing byte lengths.
  const long double product = static_cast<long double>(view->shape[0]) * view->shape[1] *
                              view->shape[2] * static_cast<long double>(DTypeSize(view->dtype));
  if (product > static_cast<long double>(int64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: [",
                                                   absl::StrJoin(view->shape, ", "),
                                                   "] is too large"));
  }
  return absl::OkStatus();
}

/// Where a region tensor's elements are (RegionSlice decoded and bounds-checked).
struct RegionGeometry {
  StridedLayout layout;
  bool dense = true;
};

/// Element offset of row (i0, i1) of a region tensor.
int64_t RowOffset(const StridedLayout& l, int64_t i0, int64_t i1) {
  const int64_t token =
      l.block_tokens > 0
          ? static_cast<int64_t>(l.block_table[i1 / l.block_tokens]) * l.block_stride +
                (i1 % l.block_tokens) * l.strides[1]
          : i1 * l.strides[1];
  return i0 * l.strides[0] + token;
}

/// Decodes strides and paging of `slice` for `view` and checks every addressed element
/// against the region's `region_bytes`.
absl::StatusOr<RegionGeometry> DecodeGeometry(const v1::RegionSlice& slice, const TensorView& view,
                                              uint64_t region_bytes, const std::string& field) {
  RegionGeometry g;
  const auto& shape = view.shape;
  const int64_t element = static_cast<int64_t>(DTypeSize(view.dtype));
  const std::array<int64_t, 3> dense = {shape[1] * shape[2], shape[2], 1};
  if (slice.strides_elements_size() == 0) {
    g.layout.strides = dense;
  } else if (slice.strides_elements_size() == 3) {
    for (int i = 0; i < 3; ++i) {
      const int64_t stride = slice.strides_elements(i);
      if (stride < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".strides_elements[", i, "]: must be >= 1, got ", stride));
      }
      g.layout.strides[i] = stride;
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".strides_elements: expected 3 strides (or none for dense), got ",
        slice.strides_elements_size()));
  }
  int64_t max_table = 0;
  if (slice.has_paged()) {
    const v1::PagedLayout& paged = slice.paged();
    if (paged.block_tokens() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".paged.block_tokens: must be >= 1, got ",
                                                     paged.block_tokens()));
    }
    if (paged.block_stride_elements() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".paged.block_stride_elements: must be >= 1, got ", paged.block_stride_elements()));
    }
    const int64_t blocks = (shape[1] + paged.block_tokens() - 1) / paged.block_tokens();
    if (paged.block_table_size() != blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".paged.block_table: ", paged.block_table_size(), " entries, but ", shape[1],
          " tokens in blocks of ", paged.block_tokens(), " need ", blocks));
    }
    for (int i = 0; i < paged.block_table_size(); ++i) {
      if (paged.block_table(i) < 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".paged.block_table[", i,
                                                       "]: must be >= 0, got ",
                                                       paged.block_table(i)));
      }
      max_table = std::max<int64_t>(max_table, paged.block_table(i));
    }
    g.layout.block_tokens = paged.block_tokens();
    g.layout.block_stride = paged.block_stride_elements();
    g.layout.block_table.assign(paged.block_table().begin(), paged.block_table().end());
  }
  if (slice.offset_bytes() % static_cast<uint64_t>(element) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".offset_bytes: ", slice.offset_bytes(),
                                                   " is not a multiple of the ", element,
                                                   "-byte element size"));
  }
  // The last element any index reaches, in 128-bit arithmetic (no overflow).
  using Wide = unsigned __int128;
  const auto& st = g.layout.strides;
  Wide last = Wide(st[0]) * Wide(shape[0] - 1) + Wide(st[2]) * Wide(shape[2] - 1);
  if (slice.has_paged()) {
    const int64_t in_block = std::min(g.layout.block_tokens, shape[1]) - 1;
    last += Wide(max_table) * Wide(g.layout.block_stride) + Wide(st[1]) * Wide(in_block);
  } else {
    last += Wide(st[1]) * Wide(shape[1] - 1);
  }
  const Wide end = Wide(slice.offset_bytes()) + (last + 1) * Wide(element);
  if (end > Wide(region_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".offset_bytes: the tensor [", absl::StrJoin(shape, ", "), "] at offset ",
        slice.offset_bytes(), " with strides [", absl::StrJoin(st, ", "), "]",
        slice.has_paged() ? " and its block table" : "", " reaches past the region's ",
        region_bytes, " bytes"));
  }
  g.dense = !slice.has_paged() && st == dense;
  return g;
}

/// Reads a host shm tensor into `owned` as dense row-major.
absl::StatusOr<const void*> ReadHostTensor(const Region& region, const v1::RegionSlice& slice,
                                           const TensorView& view, const RegionGeometry& g,
                                           const std::string& field,
                                           const std::shared_ptr<HostBufferPool>& pool,
                                           OwnedBuffers* owned) {
  const size_t bytes = static_cast<size_t>(view.nbytes());
  char* out = NewOwnedBuffer(owned, bytes, pool);
  if (g.dense) {
    KVTRIM_RETURN_IF_ERROR_STATUS(region.ReadHost(slice.offset_bytes(), out, bytes, field));
    return static_cast<const void*>(out);
  }
  // Strided / paged: one read per row (i0, i1) of C elements.
  const int64_t element = static_cast<int64_t>(DTypeSize(view.dtype));
  const int64_t c = view.shape[2];
  const int64_t s2 = g.layout.strides[2];
  std::vector<char> span;
  if (s2 != 1) span.resize(static_cast<size_t>(((c - 1) * s2 + 1) * element));
  for (int64_t i0 = 0; i0 < view.shape[0]; ++i0) {
    for (int64_t i1 = 0; i1 < view.shape[1]; ++i1) {
      const uint64_t at =
          slice.offset_bytes() + static_cast<uint64_t>(RowOffset(g.layout, i0, i1) * element);
      char* row = out + (i0 * view.shape[1] + i1) * c * element;
      if (s2 == 1) {
        KVTRIM_RETURN_IF_ERROR_STATUS(
            region.ReadHost(at, row, static_cast<size_t>(c * element), field));
        continue;
      }
      KVTRIM_RETURN_IF_ERROR_STATUS(region.ReadHost(at, span.data(), span.size(), field));
      for (int64_t j = 0; j < c; ++j) {
        std::memcpy(row + j * element, span.data() + j * s2 * element,
                    static_cast<size_t>(element));
      }
    }
  }
  return static_cast<const void*>(out);
}

/// Region tensors (host_shm or cuda_ipc).
absl::StatusOr<TensorView> DecodeRegionTensor(const v1::RegionSlice& slice, RegionKind kind,
                                              TensorView view, const std::string& field,
                                              const DecodeContext& context, OwnedBuffers* owned,
                                              std::vector<RegionPin>* pins,
                                              TransportBytes* bytes) {
  if (context.regions == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": region tensors are not available here; send inline_data"));
  }
  auto pin = context.regions->Acquire(context.client_id, slice.region_id(), kind,
                                      field + ".region_id");
  if (!pin.ok()) return pin.status();
  const Region& region = **pin;
  auto geometry = DecodeGeometry(slice, view, region.size_bytes(), field);
  if (!geometry.ok()) return geometry.status();
  if (kind == RegionKind::kHostShm && region.pinned_base() != nullptr && geometry->dense) {
    // Page-locked: the device copies the tensor from the segment itself (one DMA); kvtrimd
    // never reads it on the host (a segment the worker shrank cannot fault the process).
    view.data = region.pinned_base() + slice.offset_bytes();
    view.space = MemorySpace::kPinnedHost;
    bytes->host_shm += view.nbytes();
  } else if (kind == RegionKind::kHostShm) {
    if (view.nbytes() > context.max_host_read_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          field, ": a host_shm tensor of ", view.nbytes(), " bytes is read into memory; that "
          "exceeds --max_layer_bytes=", context.max_host_read_bytes));
    }
    auto data = ReadHostTensor(region, slice, view, *geometry, field, context.buffers, owned);
    if (!data.ok()) return data.status();
    view.data = *data;
    bytes->host_shm += view.nbytes();
  } else {
    view.data = region.device_base() + slice.offset_bytes();
    view.space = MemorySpace::kDevice;
    if (!geometry->dense) {
      view.layout = std::make_shared<StridedLayout>(std::move(geometry->layout));
    }
    bytes->cuda_ipc += view.nbytes();
  }
  pins->push_back(*std::move(pin));
  return view;
}

/// LayerInput.output: the region (host_shm or cuda_ipc of the caller), its offset and
/// capacity into out->request.output, a host target into out->host_output.
absl::Status DecodeOutput(const v1::OutputRegion& output, const std::string& field,
                          const DecodeContext& context, DecodedLayer* out) {
  const bool on_device = output.target_case() == v1::OutputRegion::kCudaIpc;
  if (output.target_case() == v1::OutputRegion::TARGET_NOT_SET) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": set host_shm or cuda_ipc (the region the lists go to)"));
  }
  const std::string slice_field = field + (on_device ? ".cuda_ipc" : ".host_shm");
  const v1::RegionSlice& slice = on_device ? output.cuda_ipc() : output.host_shm();
  if (context.regions == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(slice_field, ": output regions are not available here"));
  }
  if (slice.strides_elements_size() != 0 || slice.has_paged()) {
    return absl::InvalidArgumentError(absl::StrCat(
        slice_field, ": an output region is dense; leave strides_elements and paged empty"));
  }
  if (slice.offset_bytes() % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        slice_field, ".offset_bytes: ", slice.offset_bytes(), " is not a multiple of 8"));
  }
  auto pin = context.regions->Acquire(context.client_id, slice.region_id(),
                                      on_device ? RegionKind::kCudaIpc : RegionKind::kHostShm,
                                      slice_field + ".region_id");
  if (!pin.ok()) return pin.status();
  const Region& region = **pin;
  if (slice.offset_bytes() >= region.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        slice_field, ".offset_bytes: ", slice.offset_bytes(), " is past the region's ",
        region.size_bytes(), " bytes"));
  }
  OutputTarget& target = out->request.output;
  target.present = true;
  target.capacity = region.size_bytes() - slice.offset_bytes();
  if (on_device) {
    target.device = const_cast<char*>(region.device_base()) + slice.offset_bytes();
  } else {
    if (!output.done_event_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".done_event_id: events order device work; a host_shm output is complete "
          "when the answer arrives"));
    }
    out->host_output = HostOutput{RegionPin(), slice.offset_bytes()};
  }
  if (!output.done_event_id().empty()) {
    auto event = context.regions->Acquire(context.client_id, output.done_event_id(),
                                          RegionKind::kCudaIpcEvent, field + ".done_event_id");
    if (!event.ok()) return event.status();
    target.done_event = (*event)->event();
    out->pins.push_back(*std::move(event));
  }
  if (out->host_output.has_value()) {
    out->host_output->region = *std::move(pin);
  } else {
    out->pins.push_back(*std::move(pin));
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<int64_t> TensorByteSize(const v1::Tensor& tensor, TensorRole role,
                                       const EngineLimits& limits, const std::string& field) {
  TensorView view;
  KVTRIM_RETURN_IF_ERROR_STATUS(DecodeHeader(tensor, role, limits, field, &view));
  return view.nbytes();
}

absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, TensorRole role,
                                        const EngineLimits& limits, const std::string& field,
                                        OwnedBuffers* owned) {
  std::vector<RegionPin> pins;
  TransportBytes bytes;
  return DecodeTensor(tensor, role, limits, field, DecodeContext{}, owned, &pins, &bytes);
}

absl::StatusOr<TensorView> DecodeTensor(const v1::Tensor& tensor, TensorRole role,
                                        const EngineLimits& limits, const std::string& field,
                                        const DecodeContext& context, OwnedBuffers* owned,
                                        std::vector<RegionPin>* pins, TransportBytes* bytes) {
  TensorView view;
  KVTRIM_RETURN_IF_ERROR_STATUS(DecodeHeader(tensor, role, limits, field, &view));
  switch (tensor.data_case()) {
    case v1::Tensor::kHostShm:
      return DecodeRegionTensor(tensor.host_shm(), RegionKind::kHostShm, view,
                                field + ".host_shm", context, owned, pins, bytes);
    case v1::Tensor::kCudaIpc:
      return DecodeRegionTensor(tensor.cuda_ipc(), RegionKind::kCudaIpc, view,
                                field + ".cuda_ipc", context, owned, pins, bytes);
    case v1::Tensor::kChunked: {
      const uint32_t* assembled = context.chunks[static_cast<int>(role)];
      if (assembled == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".chunked: chunked tensors are sent in a CompressSession, each followed by "
            "its tensor_chunk messages; send inline_data here"));
      }
      if (tensor.chunked().total_bytes() != static_cast<uint64_t>(view.nbytes())) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".chunked.total_bytes: ", tensor.chunked().total_bytes(), ", but shape [",
            absl::StrJoin(view.shape, ", "), "] x ", DTypeSize(view.dtype), "-byte ",
            DTypeName(view.dtype), " needs ", view.nbytes()));
      }
      view.data = assembled;
      if (context.chunks_page_locked[static_cast<int>(role)]) {
        view.space = MemorySpace::kPinnedHost;
      }
      bytes->inline_bytes += view.nbytes();
      return view;
    }
    case v1::Tensor::kInlineData:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".inline_data: no tensor data; set inline_data, chunked, host_shm or cuda_ipc"));
  }
  const std::string& data = tensor.inline_data();
  if (static_cast<int64_t>(data.size()) != view.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".inline_data: ", data.size(), " bytes, but shape [",
        absl::StrJoin(view.shape, ", "), "] x ", DTypeSize(view.dtype), "-byte ",
        DTypeName(view.dtype), " needs ", view.nbytes()));
  }
  bytes->inline_bytes += view.nbytes();
  const auto address = reinterpret_cast<uintptr_t>(data.data());
  if (address % DTypeSize(view.dtype) != 0) {
    // Misaligned inline bytes: copy into word-aligned storage.
    char* copy = NewOwnedBuffer(owned, data.size(), context.buffers);
    std::memcpy(copy, data.data(), data.size());
    view.data = copy;
  } else {
    view.data = data.data();
  }
  return view;
}

absl::Status DecodeLayer(const v1::LayerInput& input, const EngineLimits& limits,
                         const std::string& field, const DecodeContext& context,
                         DecodedLayer* out) {
  out->tensor_bytes = InlineTensorBytes(input);
  KVTRIM_RETURN_IF_ERROR(CheckLayerId(input.layer_id(), field));
  if (!std::isfinite(input.softmax_scale()) || input.softmax_scale() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".softmax_scale: must be finite and >= 0 (0 = 1/sqrt(d)), got ",
        ExactNumber(input.softmax_scale())));
  }
  if (!input.has_keys()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".keys: required [H_kv, n, d]"));
  }
  LayerRequest& request = out->request;
  request.layer_id = input.layer_id();
  request.softmax_scale = input.softmax_scale();
  const std::pair<const v1::Tensor*, TensorRole> tensors[] = {
      {input.has_keys() ? &input.keys() : nullptr, TensorRole::kKeys},
      {input.has_values() ? &input.values() : nullptr, TensorRole::kValues},
      {input.has_queries() ? &input.queries() : nullptr, TensorRole::kQueries}};
  TensorView* views[] = {&request.keys, &request.values, &request.queries};
  const char* names[] = {".keys", ".values", ".queries"};
  for (int i = 0; i < 3; ++i) {
    if (tensors[i].first == nullptr) continue;
    auto view = DecodeTensor(*tensors[i].first, tensors[i].second, limits, field + names[i],
                             context, &out->owned, &out->pins, &out->transport);
    if (!view.ok()) return view.status();
    *views[i] = *view;
  }
  if (!input.ready_event_id().empty()) {
    if (context.regions == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".ready_event_id: region events are not available here"));
    }
    auto pin = context.regions->Acquire(context.client_id, input.ready_event_id(),
                                        RegionKind::kCudaIpcEvent, field + ".ready_event_id");
    if (!pin.ok()) return pin.status();
    request.ready_event = (*pin)->event();
    out->pins.push_back(*std::move(pin));
  }
  if (input.has_output()) return DecodeOutput(input.output(), field + ".output", context, out);
  return absl::OkStatus();
}

absl::Status WriteHostOutput(const HostOutput& output, const std::string& field,
                             LayerDecision* decision) {
  const std::string where = field + ".output.host_shm";
  const size_t offset_bytes = decision->offsets.size() * sizeof(int64_t);
  KVTRIM_RETURN_IF_ERROR_STATUS(
      output.region->WriteHost(output.offset, decision->offsets.data(), offset_bytes, where));
  KVTRIM_RETURN_IF_ERROR_STATUS(output.region->WriteHost(
      output.offset + offset_bytes, decision->indices.data(),
      decision->indices.size() * sizeof(int32_t), where));
  decision->indices.clear();
  decision->indices.shrink_to_fit();
  decision->output_written = true;
  return absl::OkStatus();
}

int64_t InlineTensorBytes(const v1::LayerInput& input) {
  int64_t total = 0;
  // Chunked tensors are counted as their chunks arrive.
  if (input.has_keys()) total += static_cast<int64_t>(input.keys().inline_data().size());
  if (input.has_values()) total += static_cast<int64_t>(input.values().inline_data().size());
  if (input.has_queries()) total += static_cast<int64_t>(input.queries().inline_data().size());
  return total;
}

}  // namespace kvtrim::service
