// Chooses and builds kvtrimd's compute backend from the configuration.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "service/config.h"

namespace kvtrim::service {

/// Builds the backend `config.backend` asks for: the CPU backend (config.workers threads),
/// or the GPU backend on every device of config.devices (all visible ones when empty):
/// config.workers worker contexts per device, each arena capped at
/// config.gpu_memory_limit_bytes / workers; several devices are served by one
/// MultiDeviceBackend. FAILED_PRECONDITION "--devices: ..." for an ordinal not visible. --backend=auto takes the GPU when this
/// build has CUDA and cudaGetDeviceCount finds a device. `detail` receives a short text for
/// the start-up line (the GPU's name; empty for the CPU).
/// Errors: FAILED_PRECONDITION "--backend=gpu: no CUDA device is visible (...)" when the
/// GPU was asked for and none is usable; UNIMPLEMENTED for --backend=gpu in a build without
/// CUDA (Config::Validate rejects that earlier); the GPU backend's own creation errors,
/// prefixed with "--backend=gpu: ".
/// `ordinals` (may be null) receives the CUDA devices served (empty for the CPU).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Config& config, std::string* detail,
                                                       std::vector<int>* ordinals = nullptr);

}  // namespace kvtrim::service
