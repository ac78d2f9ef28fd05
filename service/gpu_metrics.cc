#include "service/gpu_metrics.h"

namespace kvtrim::service {
namespace {

/// An empty gauge family.
prometheus::MetricFamily Gauge(const char* name, const char* help) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  return family;
}

/// One gauge sample labelled with the device.
prometheus::ClientMetric Sample(const GpuDeviceLabel& device, double value) {
  prometheus::ClientMetric metric;
  metric.label = {{"device", std::to_string(device.ordinal)}, {"uuid", device.uuid}};
  metric.gauge.value = value;
  return metric;
}

}  // namespace

std::vector<prometheus::MetricFamily> GpuCollector::Collect() const {
  prometheus::MetricFamily used = Gauge(
      "kvtrim_gpu_memory_used_bytes",
      "Device memory in use on a GPU kvtrimd computes on, by every process (NVML).");
  prometheus::MetricFamily total =
      Gauge("kvtrim_gpu_memory_total_bytes", "Device memory of a GPU kvtrimd computes on (NVML).");
  prometheus::MetricFamily busy = Gauge(
      "kvtrim_gpu_utilization_ratio",
      "Fraction of NVML's last sample period in which a kernel ran on the GPU, any process's.");
  for (const GpuDeviceLabel& device : devices_) {
    const std::optional<GpuFigures> figures = read_(device.uuid);
    if (!figures.has_value()) continue;
    used.metric.push_back(Sample(device, figures->memory_used_bytes));
    total.metric.push_back(Sample(device, figures->memory_total_bytes));
    busy.metric.push_back(Sample(device, figures->utilization));
  }
  if (used.metric.empty()) return {};
  return {used, total, busy};
}

}  // namespace kvtrim::service
