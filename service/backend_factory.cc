#include "service/backend_factory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"

#if KVTRIM_HAVE_CUDA
#include "kernels/gpu/runtime/device_probe.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#endif

namespace kvtrim::service {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Config& config, std::string* detail) {
  detail->clear();
#if KVTRIM_HAVE_CUDA
  // Asked only when the GPU may be wanted: --backend=cpu never touches the CUDA driver.
  const gpu::DeviceCensus census = config.backend == BackendKind::kCpu
                                       ? gpu::DeviceCensus{0, "--backend=cpu"}
                                       : gpu::CountCudaDevices();
  const bool visible = census.count > 0;
#else
  const bool visible = false;
#endif
  if (config.ResolvedBackendName(visible) == "cpu") {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(config.workers));
  }
#if KVTRIM_HAVE_CUDA
  if (!visible) {
    return absl::FailedPreconditionError(
        absl::StrCat("--backend=gpu: no CUDA device is visible (", census.reason,
                     "); use --backend=cpu, or --backend=auto to fall back to the CPU"));
  }
  gpu::GpuBackendOptions options;
  options.device = 0;
  options.workers = config.workers;
  options.launch_graphs = static_cast<size_t>(config.gpu_launch_graphs);
  if (config.gpu_memory_limit_bytes > 0) {
    options.arena_limit_bytes = static_cast<size_t>(
        std::max<int64_t>(1, config.gpu_memory_limit_bytes / std::max(1, config.workers)));
  }
  auto backend = gpu::GpuBackend::Create(options);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("--backend=gpu: ", backend.status().message()));
  }
  *detail = (*backend)->device_description();
  return std::unique_ptr<Backend>(*std::move(backend));
#else
  return absl::UnimplementedError(
      "--backend=gpu: this kvtrimd was built without CUDA (KVTRIM_CUDA=OFF); use --backend=cpu");
#endif
}

}  // namespace kvtrim::service
