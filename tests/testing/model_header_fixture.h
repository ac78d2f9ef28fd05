// The proto header of a test model (header-only): shared by the service tests, which stream
// it in RegisterModelRequests, and the client bundles of model_bundle_fixture.h.
#pragma once

#include "kernels/model.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::testing {

/// The proto header of `input`: its layout, RoPE theta, scaling and layout.
inline v1::ModelHeader HeaderOf(const ModelInput& input) {
  v1::ModelHeader h;
  h.set_name(input.layout.name);
  h.set_num_layers(input.layout.num_layers);
  h.set_num_query_heads(input.layout.num_query_heads);
  h.set_num_kv_heads(input.layout.num_kv_heads);
  h.set_head_dim(input.layout.head_dim);
  h.set_hidden_size(input.layout.hidden_size);
  h.set_rope_theta(input.rope_theta);
  h.set_rope_scaling_json(input.rope_scaling_json);
  h.set_rope_layout(input.rope_layout);
  return h;
}

}  // namespace kvtrim::testing
