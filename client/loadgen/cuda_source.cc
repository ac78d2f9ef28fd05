// The cuda_ipc transport (built with CUDA only): tensors as RegionSlices into one device
// buffer exported by CUDA IPC, with a ready event per layer.
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/loadgen/device_buffer.h"
#include "client/loadgen/layer_source.h"
#include "client/regions.h"

namespace kvtrim::loadgen {
namespace {

/// One device buffer with a slot per layer (or one shared slot), and one event; both
/// registered once.
class CudaIpcSource final : public LayerSource {
 public:
  /// `output_offset` > 0: each slot's lists go to that offset of the slot.
  CudaIpcSource(const HostLayer& layer, std::unique_ptr<DeviceBuffer> buffer,
                std::unique_ptr<RegionLease> lease, std::string region_id, std::string event_id,
                uint64_t output_offset)
      : layer_(layer),
        buffer_(std::move(buffer)),
        lease_(std::move(lease)),
        region_id_(std::move(region_id)),
        event_id_(std::move(event_id)),
        output_offset_(output_offset) {}

  /// Releases the regions (closing the lease) before the device memory is freed.
  ~CudaIpcSource() override { lease_->Close().IgnoreError(); }

  absl::StatusOr<v1::LayerInput> Layer(int32_t layer_id) override {
    // The worker "wrote" this layer's slot on its stream: mark it ready there.
    KVTRIM_RETURN_IF_ERROR(buffer_->RecordReady());
    const uint64_t base =
        static_cast<uint64_t>(layer_id % buffer_->slots()) * buffer_->slot_bytes();
    v1::LayerInput input = LayerTemplate(layer_, layer_id);
    input.set_ready_event_id(event_id_);
    Slice(input.mutable_keys(), base + layer_.keys_offset());
    if (input.has_values()) Slice(input.mutable_values(), base + layer_.values_offset());
    if (input.has_queries()) Slice(input.mutable_queries(), base + layer_.queries_offset());
    if (output_offset_ > 0) {
      // The lists stay on the device; the same event marks them written.
      v1::OutputRegion* output = input.mutable_output();
      output->mutable_cuda_ipc()->set_region_id(region_id_);
      output->mutable_cuda_ipc()->set_offset_bytes(base + output_offset_);
      output->set_done_event_id(event_id_);
    }
    return input;
  }

  int64_t WireBytesPerLayer() const override { return 0; }

  /// Adds a remark for the report.
  void AddNote(std::string note) { notes_.push_back(std::move(note)); }

 private:
  /// Points `tensor` at `offset` in the device buffer (dense layout).
  void Slice(v1::Tensor* tensor, uint64_t offset) const {
    v1::RegionSlice* slice = tensor->mutable_cuda_ipc();
    slice->set_region_id(region_id_);
    slice->set_offset_bytes(offset);
  }

  const HostLayer& layer_;
  std::unique_ptr<DeviceBuffer> buffer_;  // destroyed after the lease
  std::unique_ptr<RegionLease> lease_;
  const std::string region_id_;
  const std::string event_id_;
  const uint64_t output_offset_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerSource>> MakeCudaIpcSource(const HostLayer& layer,
                                                               int32_t layers, int32_t device,
                                                               bool output_region,
                                                               int32_t kv_heads, Client& client) {
  std::string note;
  // The output area follows the slot's tensors: 8 (H_kv + 1) + 4 H_kv n bytes.
  const uint64_t output_offset = output_region ? (layer.bytes() + 255) / 256 * 256 : 0;
  const uint64_t lists = static_cast<uint64_t>(kv_heads);
  const uint64_t tokens = static_cast<uint64_t>(layer.kv_shape[1]);
  // Slots stay 256-byte aligned (the tensors are then read in place).
  const uint64_t slot_bytes =
      output_region ? (output_offset + 8 * (lists + 1) + 4 * lists * tokens + 255) / 256 * 256
                    : layer.bytes();
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer =
      DeviceBuffer::Create(device, slot_bytes, layers, &note);
  if (!buffer.ok()) return buffer.status();
  for (const auto& [offset, bytes] :
       {std::pair<uint64_t, const std::string*>{layer.keys_offset(), &layer.keys},
        {layer.values_offset(), &layer.values},
        {layer.queries_offset(), &layer.queries}}) {
    absl::Status copied = (*buffer)->CopyToEverySlot(offset, bytes->data(), bytes->size());
    if (!copied.ok()) return copied;
  }
  absl::StatusOr<std::unique_ptr<RegionLease>> lease = client.OpenRegionLease();
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat("opening the region lease: ", lease.status().message()));
  }
  const DeviceExport& exported = (*buffer)->exported();
  absl::StatusOr<std::string> region = (*lease)->RegisterCudaIpc(
      exported.mem_handle, exported.device, exported.device_uuid, exported.size_bytes);
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat("RegisterRegion cuda_ipc: ", region.status().message()));
  }
  absl::StatusOr<std::string> event =
      (*lease)->RegisterCudaIpcEvent(exported.event_handle, exported.device_uuid);
  if (!event.ok()) {
    return absl::Status(event.status().code(),
                        absl::StrCat("RegisterRegion cuda_ipc_event: ", event.status().message()));
  }
  client.SetClientId((*lease)->client_id());
  auto source = std::make_unique<CudaIpcSource>(layer, std::move(*buffer), std::move(*lease),
                                                std::move(*region), std::move(*event),
                                                output_offset);
  if (!note.empty()) source->AddNote(std::move(note));
  return std::unique_ptr<LayerSource>(std::move(source));
}

}  // namespace kvtrim::loadgen
