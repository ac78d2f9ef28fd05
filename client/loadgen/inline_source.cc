// The inline transport: tensor bytes inside the session messages.
#include "client/loadgen/layer_source.h"

namespace kvtrim::loadgen {
namespace {

/// Sends the host layer's bytes with every layer: from its own memory (`borrow`), or as a
/// copy inside each layer message, as a worker serialising its KV cache would.
class InlineSource final : public LayerSource {
 public:
  InlineSource(const HostLayer& layer, bool borrow) : layer_(layer), borrow_(borrow) {}

  absl::StatusOr<v1::LayerInput> Layer(int32_t layer_id) override {
    v1::LayerInput input = LayerTemplate(layer_, layer_id);
    if (borrow_) return input;
    input.mutable_keys()->set_inline_data(layer_.keys);
    if (input.has_values()) input.mutable_values()->set_inline_data(layer_.values);
    if (input.has_queries()) input.mutable_queries()->set_inline_data(layer_.queries);
    return input;
  }

  int64_t WireBytesPerLayer() const override { return static_cast<int64_t>(layer_.bytes()); }

  LayerTensorBytes Bytes() const override {
    if (!borrow_) return {};
    return {absl::MakeConstSpan(layer_.keys), absl::MakeConstSpan(layer_.values),
            absl::MakeConstSpan(layer_.queries)};
  }

 private:
  const HostLayer& layer_;
  const bool borrow_;
};

}  // namespace

std::unique_ptr<LayerSource> MakeInlineSource(const HostLayer& layer, bool borrow) {
  return std::make_unique<InlineSource>(layer, borrow);
}

}  // namespace kvtrim::loadgen
