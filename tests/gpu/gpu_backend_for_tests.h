// The GPU backend as kvtrimd builds it, for the GPU tests: with the CPU backend as its host
// fallback (service/backend_factory.cc does the same).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gpu/runtime/gpu_backend.h"

namespace kvtrim::gpu::testing {

/// GpuBackend::Create(options) with a CpuBackend of HostFallbackThreads(options) threads.
inline absl::StatusOr<std::unique_ptr<GpuBackend>> CreateGpuBackend(
    const GpuBackendOptions& options = {}) {
  return GpuBackend::Create(
      options, std::make_unique<CpuBackend>(GpuBackend::HostFallbackThreads(options)));
}

}  // namespace kvtrim::gpu::testing
