// The host_shm transport: tensors as RegionSlices into one POSIX shared-memory segment.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/loadgen/layer_source.h"
#include "client/regions.h"
#include "client/shm_segment.h"

namespace kvtrim::loadgen {
namespace {

/// One segment holding one layer's K, V, Q, registered once; every layer names it.
class HostShmSource final : public LayerSource {
 public:
  HostShmSource(const HostLayer& layer, bool rewrite, std::unique_ptr<RegionLease> lease,
                std::unique_ptr<SharedMemorySegment> segment, std::string region_id)
      : layer_(layer),
        rewrite_(rewrite),
        segment_(std::move(segment)),
        lease_(std::move(lease)),
        region_id_(std::move(region_id)) {}

  /// Releases the region (closing the lease) before the segment is unlinked.
  ~HostShmSource() override { lease_->Close().IgnoreError(); }

  absl::StatusOr<v1::LayerInput> Layer(int32_t layer_id) override {
    if (rewrite_) CopyLayer(layer_, segment_->data());
    v1::LayerInput input = LayerTemplate(layer_, layer_id);
    Slice(input.mutable_keys(), layer_.keys_offset());
    if (input.has_values()) Slice(input.mutable_values(), layer_.values_offset());
    if (input.has_queries()) Slice(input.mutable_queries(), layer_.queries_offset());
    return input;
  }

  int64_t WireBytesPerLayer() const override { return 0; }

  /// Copies the layer's tensors to their offsets in `base`.
  static void CopyLayer(const HostLayer& layer, void* base) {
    char* bytes = static_cast<char*>(base);
    std::memcpy(bytes + layer.keys_offset(), layer.keys.data(), layer.keys.size());
    std::memcpy(bytes + layer.values_offset(), layer.values.data(), layer.values.size());
    std::memcpy(bytes + layer.queries_offset(), layer.queries.data(), layer.queries.size());
  }

 private:
  /// Points `tensor` at `offset` in the segment (dense layout).
  void Slice(v1::Tensor* tensor, uint64_t offset) const {
    v1::RegionSlice* slice = tensor->mutable_host_shm();
    slice->set_region_id(region_id_);
    slice->set_offset_bytes(offset);
  }

  const HostLayer& layer_;
  const bool rewrite_;
  std::unique_ptr<SharedMemorySegment> segment_;  // destroyed after the lease
  std::unique_ptr<RegionLease> lease_;
  const std::string region_id_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerSource>> MakeHostShmSource(const HostLayer& layer,
                                                               bool rewrite_per_layer,
                                                               Client& client) {
  absl::StatusOr<std::unique_ptr<SharedMemorySegment>> segment =
      SharedMemorySegment::Create(UniqueShmName("loadgen"), layer.bytes());
  if (!segment.ok()) return segment.status();
  HostShmSource::CopyLayer(layer, (*segment)->data());
  absl::StatusOr<std::unique_ptr<RegionLease>> lease = client.OpenRegionLease();
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat("opening the region lease: ", lease.status().message()));
  }
  absl::StatusOr<std::string> region =
      (*lease)->RegisterHostShm((*segment)->name(), (*segment)->size());
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat("RegisterRegion host_shm \"", (*segment)->name(),
                                     "\": ", region.status().message()));
  }
  client.SetClientId((*lease)->client_id());
  return std::unique_ptr<LayerSource>(new HostShmSource(layer, rewrite_per_layer, std::move(*lease),
                                                        std::move(*segment), std::move(*region)));
}

}  // namespace kvtrim::loadgen
