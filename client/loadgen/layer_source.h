// Where a worker's layer messages come from: one implementation per transport (inline
// bytes, a host shared-memory segment, a CUDA IPC device buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/kvtrim_client.h"
#include "client/loadgen/config.h"
#include "client/loadgen/synthetic.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::loadgen {

/// Produces one worker's layer messages for its transport. Not thread-safe: one per worker.
class LayerSource {
 public:
  virtual ~LayerSource() = default;

  /// Does what the worker does before sending layer `layer_id` (region transports: mark
  /// the layer's data ready) and returns the layer's message.
  virtual absl::StatusOr<v1::LayerInput> Layer(int32_t layer_id) = 0;

  /// Tensor bytes one layer carries on the wire (inline data; 0 for region transports).
  virtual int64_t WireBytesPerLayer() const = 0;

  /// Tensor bytes sent with every layer straight from the source's memory
  /// (Session::SendLayer with LayerTensorBytes); empty when Layer() carries them.
  virtual LayerTensorBytes Bytes() const { return {}; }

  /// Remarks for the report (e.g. a fallback the transport had to take).
  const std::vector<std::string>& notes() const { return notes_; }

 protected:
  std::vector<std::string> notes_;
};

/// The source of `config.transport` for one worker whose data is `layer`, which must
/// outlive the source. Region transports open a RegionLease on `client` (which must outlive
/// the source), register their memory once and set the client's id; the source closes the
/// lease before it frees the memory. UNIMPLEMENTED for cuda_ipc in a build without CUDA.
absl::StatusOr<std::unique_ptr<LayerSource>> MakeLayerSource(const LoadgenConfig& config,
                                                             const HostLayer& layer,
                                                             Client& client);

/// The inline source. With `borrow`, each layer's tensors are sent as chunks straight from
/// `layer`'s memory (as a worker whose KV cache sits in host memory would send it); else
/// every layer message carries a copy of `layer`'s bytes (one message per layer).
std::unique_ptr<LayerSource> MakeInlineSource(const HostLayer& layer, bool borrow);

/// The host_shm source: one segment holding `layer`, registered once and named by every
/// layer; with `rewrite_per_layer`, the layer's bytes are copied into it again before each
/// layer is sent (what a worker staging its KV cache would pay).
absl::StatusOr<std::unique_ptr<LayerSource>> MakeHostShmSource(const HostLayer& layer,
                                                               bool rewrite_per_layer,
                                                               Client& client);

/// The cuda_ipc source (builds with CUDA only): one device buffer with a slot per layer
/// (one shared slot when `layers` slots do not fit in free device memory), registered once,
/// and one interprocess event recorded before each layer and named in ready_event_id.
/// With `output_region`, each layer's slot also holds room for its kept lists (H_kv =
/// `kv_heads` lists at most), named as the layer's output region with the slot's event
/// as its done event.
absl::StatusOr<std::unique_ptr<LayerSource>> MakeCudaIpcSource(const HostLayer& layer,
                                                               int32_t layers, int32_t device,
                                                               bool output_region,
                                                               int32_t kv_heads, Client& client);

}  // namespace kvtrim::loadgen
