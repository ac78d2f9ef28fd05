// kvtrimd's configured limits as Prometheus gauges (kvtrim_limit_*), set once at start-up,
// so that dashboards and alerts compare usage with the limit this kvtrimd really runs with
// instead of a number copied into a rule. Where a usage gauge exists the limit carries its
// name: kvtrim_inflight_requests against kvtrim_limit_inflight_requests, and so on.
#pragma once

#include <string>
#include <vector>

#include "prometheus/registry.h"
#include "service/config.h"

namespace kvtrim::service {

/// One exported limit.
struct Limit {
  std::string name;   // the metric's name, "kvtrim_limit_..."
  std::string help;   // the flag it comes from and what it bounds
  double value = 0;   // +Inf where the flag's value means "no limit"
};

/// The limits of `config`, in a fixed order.
std::vector<Limit> LimitsOf(const Config& config);

/// Registers one gauge family per limit of `config` in `registry` and sets it.
void PublishLimits(const Config& config, prometheus::Registry& registry);

}  // namespace kvtrim::service
