// kvtrimd's request-handling state for the request and session fuzz targets: the builtin
// policies, the CPU backend, the engine with the service's default limits, metrics, an
// in-memory model store holding the sample model, and the ServiceCore over them; built the
// way service/server.cc builds them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fuzz/limits.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/engine.h"
#include "kernels/registry.h"
#include "service/metrics.h"
#include "service/model_store.h"
#include "service/service_core.h"
#include "service/tensor_codec.h"

namespace kvtrim::fuzz {

/// One per process (libFuzzer's entry point has no other place for state). An INTERNAL
/// failure of the CPU backend aborts the process: the service would report it as a device
/// failure, and on the CPU it is a bug.
class FuzzService {
 public:
  /// The process's instance, built on first use and never destroyed (its work pool's
  /// threads are not joined at exit).
  static FuzzService& Get();

  /// The service state the RPC handlers share (engine, metrics, models, limits).
  service::ServiceCore& core() { return *core_; }
  /// The decoding context of a call without regions: client id "fuzz", heap buffers.
  service::DecodeContext MakeDecodeContext() const;

 private:
  FuzzService();

  PolicyRegistry registry_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<PolicyEngine> engine_;
  std::unique_ptr<service::Metrics> metrics_;
  std::unique_ptr<service::ModelStore> models_;
  std::unique_ptr<service::ServiceCore> core_;
};

}  // namespace kvtrim::fuzz
