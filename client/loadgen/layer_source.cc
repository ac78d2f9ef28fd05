#include "client/loadgen/layer_source.h"

#include "absl/status/status.h"

namespace kvtrim::loadgen {

absl::StatusOr<std::unique_ptr<LayerSource>> MakeLayerSource(const LoadgenConfig& config,
                                                             const HostLayer& layer,
                                                             Client& client) {
  switch (config.transport) {
    case Transport::kInline:
      return MakeInlineSource(layer, /*borrow=*/config.chunk_bytes > 0);
    case Transport::kHostShm:
      return MakeHostShmSource(layer, config.rewrite_per_layer, client);
    case Transport::kCudaIpc:
#if KVTRIM_LOADGEN_CUDA
      return MakeCudaIpcSource(layer, config.layers, config.device, config.output_region,
                               config.kv_heads, client);
#else
      return absl::UnimplementedError(
          "--transport=cuda_ipc: kvtrim-loadgen was built without CUDA");
#endif
  }
  return absl::InvalidArgumentError("--transport: unknown transport");
}

}  // namespace kvtrim::loadgen
