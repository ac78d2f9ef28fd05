// Chooses and builds kvtrimd's compute backend from the configuration.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "service/config.h"

namespace kvtrim::service {

/// Builds the backend `config.backend` asks for: the CPU backend (config.workers threads),
/// or the GPU backend (config.workers worker contexts on CUDA device 0, each arena capped
/// at config.gpu_memory_limit_bytes / workers). --backend=auto takes the GPU when this
/// build has CUDA and cudaGetDeviceCount finds a device. `detail` receives a short text for
/// the start-up line (the GPU's name; empty for the CPU).
/// Errors: FAILED_PRECONDITION "--backend=gpu: no CUDA device is visible (...)" when the
/// GPU was asked for and none is usable; UNIMPLEMENTED for --backend=gpu in a build without
/// CUDA (Config::Validate rejects that earlier); the GPU backend's own creation errors,
/// prefixed with "--backend=gpu: ".
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Config& config, std::string* detail);

}  // namespace kvtrim::service
