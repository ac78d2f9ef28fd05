// Policy set-up shared by the GPU tests: the built-in registry, a policy prepared for the
// few query rows a test sends, and a one-worker GPU backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/registry.h"
#include "tests/gpu/gpu_backend_for_tests.h"

namespace kvtrim::gpu::testing {

/// The registry with every built-in policy, built once and shared by every test.
inline const PolicyRegistry& BuiltinRegistry() {
  static const PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry();
    RegisterBuiltinPolicies(r);
    return r;
  }();
  return *registry;
}

/// `settings` prepared by `engine`, the policy's "window" parameter (its default or the one
/// sent) lowered to `rows_sent` when larger: the tests send fewer query rows than the default
/// window. Resolution errors come back as they are.
inline absl::StatusOr<ResolvedPolicy> PrepareForRows(const PolicyEngine& engine,
                                                     CompressionSettings settings,
                                                     int64_t rows_sent) {
  auto probe = BuiltinRegistry().Resolve(settings, "settings");
  if (!probe.ok()) return probe.status();
  if (probe->params.Has("window") && probe->params.Int("window") > rows_sent) {
    settings.params["window"] = ParamValue::Number(static_cast<double>(rows_sent));
  }
  return engine.Prepare(settings, "settings");
}

/// A GpuBackend with one worker and `launch_graphs` graphs per worker (null, with a test
/// failure, when it cannot be created).
inline std::unique_ptr<GpuBackend> OneWorkerBackend(size_t launch_graphs) {
  GpuBackendOptions options;
  options.workers = 1;
  options.launch_graphs = launch_graphs;
  auto backend = testing::CreateGpuBackend(options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

}  // namespace kvtrim::gpu::testing
