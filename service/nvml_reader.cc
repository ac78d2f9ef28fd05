#include "service/nvml_reader.h"

#include <dlfcn.h>

#include <type_traits>

namespace kvtrim::service {
namespace {

// The few NVML types these calls use, as NVML's C API (nvml.h) defines them: a status code
// (0 = NVML_SUCCESS), an opaque device handle and two plain structs.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
constexpr NvmlReturn kNvmlSuccess = 0;

}  // namespace

/// The library handle and the entry points kvtrimd calls.
struct NvmlReader::Api {
  void* library = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
};

std::unique_ptr<NvmlReader> NvmlReader::Load(std::string* why) {
  auto api = std::make_unique<Api>();
  api->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    const char* error = dlerror();
    if (why != nullptr) *why = error != nullptr ? error : "libnvidia-ml.so.1 cannot be loaded";
    return nullptr;
  }
  const auto resolve = [&api](auto& entry, const char* name) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(api->library, name));
    return entry != nullptr;
  };
  if (!resolve(api->init, "nvmlInit_v2") || !resolve(api->shutdown, "nvmlShutdown") ||
      !resolve(api->by_uuid, "nvmlDeviceGetHandleByUUID") ||
      !resolve(api->memory, "nvmlDeviceGetMemoryInfo") ||
      !resolve(api->utilization, "nvmlDeviceGetUtilizationRates")) {
    if (why != nullptr) *why = "libnvidia-ml.so.1 lacks an NVML entry point";
    dlclose(api->library);
    return nullptr;
  }
  if (const NvmlReturn status = api->init(); status != kNvmlSuccess) {
    if (why != nullptr) *why = "nvmlInit_v2 failed with NVML status " + std::to_string(status);
    dlclose(api->library);
    return nullptr;
  }
  return std::unique_ptr<NvmlReader>(new NvmlReader(std::move(api)));
}

NvmlReader::NvmlReader(std::unique_ptr<Api> api) : api_(std::move(api)) {}

NvmlReader::~NvmlReader() {
  api_->shutdown();
  dlclose(api_->library);
}

std::optional<GpuFigures> NvmlReader::Read(const std::string& uuid) const {
  NvmlDevice device = nullptr;
  if (api_->by_uuid(uuid.c_str(), &device) != kNvmlSuccess) return std::nullopt;
  NvmlMemory memory{};
  NvmlUtilization utilization{};
  if (api_->memory(device, &memory) != kNvmlSuccess ||
      api_->utilization(device, &utilization) != kNvmlSuccess) {
    return std::nullopt;
  }
  GpuFigures figures;
  figures.memory_used_bytes = static_cast<double>(memory.used);
  figures.memory_total_bytes = static_cast<double>(memory.total);
  figures.utilization = utilization.gpu / 100.0;
  return figures;
}

}  // namespace kvtrim::service
