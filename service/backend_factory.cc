#include "service/backend_factory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/multi_device_backend.h"

#if KVTRIM_HAVE_CUDA
#include "kernels/gpu/runtime/device_probe.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#endif

namespace kvtrim::service {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const Config& config, std::string* detail,
                                                       std::vector<int>* served) {
  detail->clear();
  if (served != nullptr) served->clear();
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
  // The devices to serve: --devices, or every visible one.
  std::vector<int> ordinals = config.devices;
  if (ordinals.empty()) {
    for (int d = 0; d < census.count; ++d) ordinals.push_back(d);
  }
  for (int ordinal : ordinals) {
    if (ordinal >= census.count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--devices: CUDA device ", ordinal, " is not visible (", census.count,
          " device(s): 0..", census.count - 1, "; check CUDA_VISIBLE_DEVICES)"));
    }
  }
  std::vector<MultiDeviceBackend::Device> devices;
  std::vector<std::string> described;
  for (int ordinal : ordinals) {
    gpu::GpuBackendOptions options;
    options.device = ordinal;
    options.workers = config.workers;
    options.launch_graphs = static_cast<size_t>(config.gpu_launch_graphs);
    if (config.gpu_memory_limit_bytes > 0) {
      options.arena_limit_bytes = static_cast<size_t>(
          std::max<int64_t>(1, config.gpu_memory_limit_bytes / std::max(1, config.workers)));
    }
    auto backend = gpu::GpuBackend::Create(
        options, std::make_unique<CpuBackend>(gpu::GpuBackend::HostFallbackThreads(options)));
    if (!backend.ok()) {
      return absl::Status(backend.status().code(),
                          absl::StrCat("--backend=gpu: device ", ordinal, ": ",
                                       backend.status().message()));
    }
    described.push_back((*backend)->device_description());
    devices.push_back({ordinal, *std::move(backend)});
  }
  *detail = absl::StrJoin(described, "; ");
  if (served != nullptr) *served = ordinals;
  if (devices.size() == 1) return std::move(devices.front().backend);
  return std::unique_ptr<Backend>(
      std::make_unique<MultiDeviceBackend>(std::move(devices), gpu::DeviceOfAddress));
#else
  return absl::UnimplementedError(
      "--backend=gpu: this kvtrimd was built without CUDA (KVTRIM_CUDA=OFF); use --backend=cpu");
#endif
}

}  // namespace kvtrim::service
