#include "kernels/gpu/runtime/device_input_stage.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/kernels/device_inputs.h"
#include "kernels/layer_error.h"

namespace kvtrim::gpu {

namespace {

/// The gather launcher's view of a strided tensor at `src` with its table at `table`.
DeviceStridedLayout ToDeviceLayout(const TensorView& view, const int32_t* table) {
  DeviceStridedLayout l{};
  for (int i = 0; i < 3; ++i) {
    l.shape[i] = view.shape[i];
    l.strides[i] = view.layout->strides[i];
  }
  l.block_tokens = view.layout->block_tokens;
  l.block_stride = view.layout->block_stride;
  l.block_table = table;
  return l;
}

/// "<name>: contains NaN at [a, b, c]" for flat index `i` of `view`, reading the element.
absl::Status NonFiniteStatus(const char* name, const TensorView& view, const void* dense,
                             unsigned long long i) {
  const size_t element = DTypeSize(view.dtype);
  uint32_t raw = 0;
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&raw, static_cast<const char*>(dense) + i * element, element,
                 cudaMemcpyDeviceToHost),
      "cudaMemcpy(non-finite element)");
  float value = 0;
  ConvertToF32(view.dtype, &raw, 1, &value);
  return AsLayerFieldError(NonFiniteError(name, view, static_cast<int64_t>(i), value), name);
}

}  // namespace

void DeviceInputStage::AddSlots(const ValidatedLayer& layer, bool reads_keys, bool reads_values,
                                bool reads_queries, ArenaLayout* layout) {
  const TensorView* views[3] = {&layer.keys, &layer.values, &layer.queries};
  const bool reads[3] = {reads_keys, reads_values, reads_queries};
  const char* names[3] = {"keys", "values", "queries"};
  ready_event_ = layer.ready_event;
  for (int i = 0; i < 3; ++i) {
    StagedInput& in = inputs_[i];
    in = StagedInput{};
    in.name = names[i];
    if (!reads[i] || !views[i]->present()) {
      in.dense_at = layout->Add(0);
      continue;
    }
    in.view = views[i];
    // The kernels' vector loads (and TMA) need aligned rows: a dense device tensor at an
    // address that is only element-aligned is copied into the arena first.
    in.in_place = views[i]->on_device() && views[i]->layout == nullptr &&
                  reinterpret_cast<uintptr_t>(views[i]->data) % kInPlaceAlignment == 0;
    in.dense_at = layout->Add(in.in_place ? 0 : static_cast<size_t>(views[i]->nbytes()));
    if (views[i]->on_device() && views[i]->layout != nullptr &&
        views[i]->layout->block_tokens > 0) {
      in.table_bytes = views[i]->layout->block_table.size() * sizeof(int32_t);
      in.table_at = layout->Add(in.table_bytes);
    }
  }
  probe_at_ = layout->Add(3 * sizeof(unsigned long long));
}

const void* DeviceInputStage::DevicePointer(int i, char* base) const {
  static const char kPlaceholder = 0;
  const StagedInput& in = inputs_[i];
  if (in.view == nullptr) return base != nullptr ? base + in.dense_at : &kPlaceholder;
  if (in.in_place) return in.view->data;
  return base != nullptr ? base + in.dense_at : &kPlaceholder;
}

uint32_t DeviceInputStage::device_read_inputs() const {
  uint32_t bits = 0;
  for (int i = 0; i < 3; ++i) {
    if (inputs_[i].view != nullptr && !inputs_[i].view->host_readable()) bits |= 1u << i;
  }
  return bits;
}

absl::Status DeviceInputStage::Stage(WorkerContext& context, char* base,
                                     unsigned long long* probe_words, StageEvents* events,
                                     uint32_t fused, unsigned int* finite_flag) {
  probe_words_ = nullptr;
  fused_ = finite_flag != nullptr ? fused & device_read_inputs() : 0;
  finite_flag_ = finite_flag;
  if (finite_flag != nullptr) *finite_flag = 0;
  cudaStream_t stream = context.stream();
  bool any_device = false;
  for (const StagedInput& in : inputs_) any_device |= in.view != nullptr && in.view->on_device();
  if (events != nullptr) KVTRIM_RETURN_IF_ERROR(events->Record(StageEvents::kBegin, stream));
  if (any_device && ready_event_ != nullptr) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ready_event_), 0),
        "cudaStreamWaitEvent(ready_event)");
  }
  if (events != nullptr) KVTRIM_RETURN_IF_ERROR(events->Record(StageEvents::kWaited, stream));
  auto* probes = reinterpret_cast<unsigned long long*>(base + probe_at_);
  for (int i = 0; i < 3; ++i) {
    StagedInput& in = inputs_[i];
    if (in.view == nullptr) continue;
    const TensorView& view = *in.view;
    if (view.host_readable()) {
      KVTRIM_RETURN_IF_ERROR(
          context.Upload(base + in.dense_at, view.data, static_cast<size_t>(view.nbytes())));
      in.device_data = base + in.dense_at;
      continue;
    }
    if (!view.on_device()) {  // page-locked host shm: one DMA, no staging
      KVTRIM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(base + in.dense_at, view.data, static_cast<size_t>(view.nbytes()),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync(pinned host input)");
      in.device_data = base + in.dense_at;
      continue;
    }
    if (in.in_place) {
      in.device_data = view.data;
    } else if (view.layout == nullptr) {  // dense but misaligned
      KVTRIM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(base + in.dense_at, view.data, static_cast<size_t>(view.nbytes()),
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync(misaligned input)");
      in.device_data = base + in.dense_at;
    } else {
      const int32_t* table = nullptr;
      if (in.table_bytes > 0) {
        KVTRIM_RETURN_IF_ERROR(
            context.Upload(base + in.table_at, view.layout->block_table.data(), in.table_bytes));
        table = reinterpret_cast<const int32_t*>(base + in.table_at);
      }
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchGatherStrided(view.data, ToDeviceLayout(view, table),
                              static_cast<int>(DTypeSize(view.dtype)), base + in.dense_at,
                              stream),
          "LaunchGatherStrided");
      in.device_data = base + in.dense_at;
    }
  }
  auto probed = [&](int i) {
    return inputs_[i].view != nullptr && !inputs_[i].view->host_readable() &&
           (fused_ & (1u << i)) == 0;
  };
  probe_device_ = reinterpret_cast<unsigned long long*>(base + probe_at_);
  if (!probed(0) && !probed(1) && !probed(2)) return absl::OkStatus();
  // The probes read what the kernels read, on the side stream: the scorer starts at once and
  // the answer is held back until CheckProbes has read their result.
  if (probe_words == nullptr) return absl::InvalidArgumentError("input probes: no pinned words");
  cudaStream_t side = context.side_stream();
  KVTRIM_RETURN_IF_ERROR(context.ForkSide());
  for (int i = 0; i < 3; ++i) {
    const StagedInput& in = inputs_[i];
    probe_words[i] = ~0ull;
    if (!probed(i)) continue;
    KVTRIM_CUDA_RETURN_IF_ERROR(LaunchFindFirstNonFinite(in.device_data, in.view->dtype,
                                                         in.view->numel(), probes + i, side),
                                "LaunchFindFirstNonFinite");
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(probe_words + i, probes + i, sizeof *probes,
                                                cudaMemcpyDeviceToHost, side),
                                "cudaMemcpyAsync(input probes)");
  }
  probe_words_ = probe_words;
  return absl::OkStatus();
}

absl::Status DeviceInputStage::CheckProbes(WorkerContext& context) const {
  const bool fused_hit = fused_ != 0 && *finite_flag_ != 0;
  for (int i = 0; i < 3; ++i) {
    const StagedInput& in = inputs_[i];
    if (in.view == nullptr || in.view->host_readable()) continue;
    unsigned long long first = ~0ull;
    if ((fused_ & (1u << i)) != 0) {
      if (!fused_hit) continue;
      // The scorer saw a NaN / Inf in one of the inputs it checked: find the element (the
      // error path only).
      KVTRIM_CUDA_RETURN_IF_ERROR(
          LaunchFindFirstNonFinite(in.device_data, in.view->dtype, in.view->numel(),
                                   probe_device_ + i, context.stream()),
          "LaunchFindFirstNonFinite");
      KVTRIM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(&first, probe_device_ + i, sizeof first, cudaMemcpyDeviceToHost,
                          context.stream()),
          "cudaMemcpyAsync(input probe)");
      KVTRIM_RETURN_IF_ERROR(context.Synchronize());
    } else if (probe_words_ != nullptr) {
      first = probe_words_[i];
    }
    if (first == ~0ull) continue;
    return NonFiniteStatus(in.name, *in.view, in.device_data, first);
  }
  return absl::OkStatus();
}

absl::Status DownloadDense(WorkerContext& context, const TensorView& view, void* ready_event,
                           std::vector<uint32_t>* out) {
  cudaStream_t stream = context.stream();
  const size_t bytes = static_cast<size_t>(view.nbytes());
  out->assign((bytes + 3) / 4, 0);
  if (ready_event != nullptr) {
    KVTRIM_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ready_event), 0),
        "cudaStreamWaitEvent(ready_event)");
  }
  const void* dense = view.data;
  void* scratch = nullptr;
  if (view.layout != nullptr) {
    // Rare (host-side preparation of a strided tensor): a temporary device buffer.
    const size_t table_bytes = view.layout->block_table.size() * sizeof(int32_t);
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&scratch, bytes + table_bytes + 16, stream),
                                "cudaMallocAsync(download)");
    const int32_t* table = nullptr;
    if (table_bytes > 0) {
      auto* t = reinterpret_cast<int32_t*>(static_cast<char*>(scratch) + AlignUp(bytes, 16));
      cudaMemcpyAsync(t, view.layout->block_table.data(), table_bytes, cudaMemcpyHostToDevice,
                      stream);
      table = t;
    }
    cudaError_t err = LaunchGatherStrided(view.data, ToDeviceLayout(view, table),
                                          static_cast<int>(DTypeSize(view.dtype)), scratch, stream);
    if (err != cudaSuccess) {
      cudaFreeAsync(scratch, stream);
      return CudaStatus(err, "LaunchGatherStrided(download)");
    }
    dense = scratch;
  } else if (!view.on_device()) {
    // A page-locked host mapping: through device memory, since a host-to-host copy would
    // read the mapping on the host (SIGBUS once the worker shrank its segment).
    KVTRIM_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&scratch, bytes, stream),
                                "cudaMallocAsync(download)");
    cudaError_t err = cudaMemcpyAsync(scratch, view.data, bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) {
      cudaFreeAsync(scratch, stream);
      return CudaStatus(err, "cudaMemcpyAsync(download)");
    }
    dense = scratch;
  }
  cudaError_t err = cudaMemcpyAsync(out->data(), dense, bytes, cudaMemcpyDeviceToHost, stream);
  if (scratch != nullptr) cudaFreeAsync(scratch, stream);
  if (err != cudaSuccess) return CudaStatus(err, "cudaMemcpyAsync(download)");
  return context.Synchronize();
}

}  // namespace kvtrim::gpu
