#include "service/limit_metrics.h"

#include <algorithm>
#include <limits>

#include "prometheus/gauge.h"

namespace kvtrim::service {
namespace {

/// `value`, or +Inf when it is 0 and 0 means "no limit".
double ZeroIsUnlimited(double value) {
  return value == 0 ? std::numeric_limits<double>::infinity() : value;
}

}  // namespace

std::vector<Limit> LimitsOf(const Config& config) {
  return {
      {"kvtrim_limit_inflight_requests",
       "--max_inflight: Compress and CompressSession calls admitted at once "
       "(compare kvtrim_inflight_requests)",
       static_cast<double>(std::max(1, config.max_inflight))},
      {"kvtrim_limit_admission_wait_seconds",
       "--admission_wait_ms: how long a call waits for a --max_inflight slot before "
       "RESOURCE_EXHAUSTED",
       config.admission_wait_ms / 1e3},
      {"kvtrim_limit_region_leases",
       "--max_leases: Regions leases held at once (compare kvtrim_region_leases)",
       static_cast<double>(config.max_leases)},
      {"kvtrim_limit_regions_per_client",
       "--max_regions_per_client: regions one lease may register (0 without "
       "--allow_client_shm: none)",
       config.allow_client_shm ? static_cast<double>(config.max_regions_per_client) : 0.0},
      {"kvtrim_limit_pinned_shm_bytes",
       "--max_pinned_shm_bytes: host shm bytes page-locked at once (compare "
       "kvtrim_pinned_shm_bytes)",
       static_cast<double>(config.max_pinned_shm_bytes)},
      {"kvtrim_limit_message_bytes", "--max_message_bytes: largest gRPC message received",
       static_cast<double>(config.max_message_bytes)},
      {"kvtrim_limit_layer_bytes",
       "--max_layer_bytes: largest layer assembled from chunks or read from host shm",
       static_cast<double>(config.max_layer_bytes)},
      {"kvtrim_limit_models", "--max_models: models registered at once",
       static_cast<double>(config.max_models)},
      {"kvtrim_limit_model_bytes", "--max_model_bytes: largest registered model",
       static_cast<double>(config.max_model_bytes)},
      {"kvtrim_limit_host_buffer_pool_bytes",
       "--host_buffer_pool_bytes: idle pooled host buffers kept (compare "
       "kvtrim_host_buffer_bytes{state=\"idle\"})",
       static_cast<double>(config.host_buffer_pool_bytes)},
      {"kvtrim_limit_pinned_buffer_bytes",
       "--max_pinned_buffer_bytes: pooled host buffers page-locked at once (compare "
       "kvtrim_pinned_buffer_bytes)",
       static_cast<double>(config.max_pinned_buffer_bytes)},
      {"kvtrim_limit_gpu_memory_bytes",
       "--gpu_memory_limit_bytes: device memory the GPU backend's worker arenas may hold "
       "together (+Inf: no cap)",
       ZeroIsUnlimited(static_cast<double>(config.gpu_memory_limit_bytes))},
      {"kvtrim_limit_drain_timeout_seconds",
       "--drain_timeout_s: how long SIGTERM waits for calls in flight",
       static_cast<double>(config.drain_timeout_s)},
      {"kvtrim_limit_workers", "--workers: compute worker threads per backend",
       static_cast<double>(config.workers)},
  };
}

void PublishLimits(const Config& config, prometheus::Registry& registry) {
  for (const Limit& limit : LimitsOf(config)) {
    prometheus::BuildGauge()
        .Name(limit.name)
        .Help(limit.help)
        .Register(registry)
        .Add({})
        .Set(limit.value);
  }
}

}  // namespace kvtrim::service
