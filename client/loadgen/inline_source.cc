// The inline transport: tensor bytes inside the session messages.
#include "client/loadgen/layer_source.h"

namespace kvtrim::loadgen {
namespace {

/// Copies the host layer's bytes into every layer message, as a worker serialising its
/// KV cache would.
class InlineSource final : public LayerSource {
 public:
  explicit InlineSource(const HostLayer& layer) : layer_(layer) {}

  absl::StatusOr<v1::LayerInput> Layer(int32_t layer_id) override {
    v1::LayerInput input = LayerTemplate(layer_, layer_id);
    input.mutable_keys()->set_inline_data(layer_.keys);
    if (input.has_values()) input.mutable_values()->set_inline_data(layer_.values);
    if (input.has_queries()) input.mutable_queries()->set_inline_data(layer_.queries);
    return input;
  }

  int64_t WireBytesPerLayer() const override { return static_cast<int64_t>(layer_.bytes()); }

 private:
  const HostLayer& layer_;
};

}  // namespace

std::unique_ptr<LayerSource> MakeInlineSource(const HostLayer& layer) {
  return std::make_unique<InlineSource>(layer);
}

}  // namespace kvtrim::loadgen
