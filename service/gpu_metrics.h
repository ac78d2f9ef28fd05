// Per-device GPU metrics of the devices kvtrimd computes on, read at every scrape:
// kvtrim_gpu_memory_used_bytes, kvtrim_gpu_memory_total_bytes and kvtrim_gpu_utilization_ratio,
// labelled with the CUDA ordinal (`device`, as kvtrim_device_layers_total) and the UUID.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "service/nvml_reader.h"

namespace kvtrim::service {

/// A device kvtrimd serves: its CUDA ordinal and "GPU-…" UUID.
struct GpuDeviceLabel {
  int ordinal = 0;
  std::string uuid;
};

/// A collectable for the metrics exposer: the three kvtrim_gpu_* families for `devices`, from
/// `read` (NVML in kvtrimd; a fake in tests). A device `read` cannot answer for is left out of
/// that scrape. Thread-safe when `read` is.
class GpuCollector : public prometheus::Collectable {
 public:
  using Reader = std::function<std::optional<GpuFigures>(const std::string& uuid)>;
  GpuCollector(std::vector<GpuDeviceLabel> devices, Reader read)
      : devices_(std::move(devices)), read_(std::move(read)) {}

  /// The three families, one sample per device answered.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::vector<GpuDeviceLabel> devices_;
  Reader read_;
};

}  // namespace kvtrim::service
