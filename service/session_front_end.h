// The protocol half of a CompressSession: message order, settings and the engine's
// validation of each layer, done ahead of the computation of the layers before it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>

#include "kernels/engine.h"
#include "service/service_core.h"
#include "service/session_input.h"

namespace kvtrim::service {

/// Checks each item in stream order and prepares it for the computation: `begin` resolves
/// the policy, a layer is validated by the engine. A violation turns the item into kError
/// (the session's last item): `layer` or `finish` before `begin`, or a second `begin` ->
/// FAILED_PRECONDITION naming that message; a repeated layer_id -> INVALID_ARGUMENT
/// "layer.layer_id"; an empty message -> INVALID_ARGUMENT "message". With begin.num_layers
/// = 0, each layer's policy has num_layers = max(layer_id seen so far) + 1. Not
/// thread-safe: one caller, items in stream order.
class SessionFrontEnd {
 public:
  explicit SessionFrontEnd(ServiceCore& core) : core_(core) {}

  /// Checks and prepares `item` (sets its policy, validated layer, validate time).
  void Process(SessionItem* item);

 private:
  void Begin(SessionItem* item);
  void Layer(SessionItem* item);

  ServiceCore& core_;
  bool begun_ = false;
  bool num_layers_known_ = false;  // begin.num_layers > 0
  int32_t max_layer_id_ = -1;
  std::set<int32_t> seen_;
  std::shared_ptr<const ResolvedPolicy> policy_;
};

}  // namespace kvtrim::service
