// The start-up warm-up: one tiny synthetic layer through every preset of the registry.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/engine.h"

namespace kvtrim::service {

/// What the warm-up did.
struct WarmUpReport {
  std::vector<std::string> warmed;   // presets that compressed the synthetic layer
  std::vector<std::string> skipped;  // presets that need a registered model, a profile or
                                     // a whole model (cannot run before registration)
};

/// Runs one synthetic f32 layer (keys/values [2, 64, 8], queries [4, 32, 8], layer 1 of 4,
/// keep_fraction 0.5) through PolicyEngine::Prepare and CompressLayer for every preset, in
/// every numerics mode `backend` (the engine's) lists for it, and checks the answer's CSR
/// shape. The first failure is returned as INTERNAL naming the preset and mode; the server
/// then stays NOT_SERVING and exits.
absl::Status WarmUp(const PolicyEngine& engine, const Backend& backend, WarmUpReport* report);

}  // namespace kvtrim::service
