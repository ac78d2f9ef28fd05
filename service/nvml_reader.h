// Reads a GPU's memory use and utilisation through NVML (the driver's libnvidia-ml.so.1),
// loaded with dlopen at run time: kvtrimd links no NVML library, and a machine without the
// driver (CPU builds, CI) simply has no reader.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace kvtrim::service {

/// One reading of a GPU, as NVML reports it for the whole device (every process on it).
struct GpuFigures {
  double memory_used_bytes = 0;   // nvmlMemory_t.used
  double memory_total_bytes = 0;  // nvmlMemory_t.total
  double utilization = 0;         // nvmlUtilization_t.gpu / 100: the fraction of the last
                                  // sample period (1/6 s .. 1 s) in which a kernel ran
};

/// NVML, initialised once; Read() per device and scrape. Thread-safe (NVML's calls are).
class NvmlReader {
 public:
  /// The reader, or null when libnvidia-ml.so.1 cannot be loaded or NVML does not
  /// initialise (no driver, no GPU); `why` (optional) receives the reason.
  static std::unique_ptr<NvmlReader> Load(std::string* why = nullptr);
  ~NvmlReader();
  NvmlReader(const NvmlReader&) = delete;
  NvmlReader& operator=(const NvmlReader&) = delete;

  /// The figures of the device whose UUID is `uuid` ("GPU-xxxxxxxx-xxxx-..."), or nullopt
  /// when NVML does not know it or a query fails.
  std::optional<GpuFigures> Read(const std::string& uuid) const;

 private:
  struct Api;
  explicit NvmlReader(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace kvtrim::service
