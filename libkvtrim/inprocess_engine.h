// The kvtrim engine inside the caller's process (libkvtrim, kvtrim_c.h): the same policy
// registry, backends, settings codec, model store and answer encoding as kvtrimd, without
// gRPC or a second process. Tensors are the caller's own host or device memory.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/engine.h"
#include "kernels/registry.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "libkvtrim/caller_layer.h"
#include "libkvtrim/ready_events.h"
#include "service/config.h"
#include "service/model_store.h"

namespace kvtrim::inprocess {

/// How an engine is built (the kvtrimd flags that matter in-process).
struct EngineOptions {
  service::BackendKind backend = service::BackendKind::kAuto;  // cpu | gpu | auto
  int device = 0;                               // GPU backend: the CUDA ordinal computed on
  int workers = 1;                              // CPU threads, or GPU worker contexts
  Numerics default_numerics = Numerics::kFast;  // for settings.numerics UNSPECIFIED
  int max_models = 16;
  int64_t max_model_bytes = int64_t{16} << 30;
};

/// An engine: thread-safe (Compress may run from several threads at once).
class InprocessEngine {
 public:
  /// Builds the backend, registry and engine. Errors as kvtrimd's start-up (e.g.
  /// FAILED_PRECONDITION "--backend=gpu: no CUDA device is visible").
  static absl::StatusOr<std::unique_ptr<InprocessEngine>> Create(const EngineOptions& options);

  /// Registers a model from the messages of a RegisterModel stream (header first, then
  /// weight chunks), as kvtrimd does; returns its digest. Errors as RegisterModel's.
  absl::StatusOr<std::string> RegisterModel(const std::vector<std::string_view>& messages);

  /// Compresses `layers` under `settings`, as the Compress RPC does (per-layer policies layer
  /// by layer, model-wide ones over all of them). Device tensors are read after the work
  /// queued so far on `cuda_stream` (a cudaStream_t; null = the legacy default stream), and
  /// the call returns once the answer is on the host. Errors are INVALID_ARGUMENT naming
  /// the field ("layers[0].keys.shape: ...") as the RPC's are.
  absl::StatusOr<v1::CompressResponse> Compress(const v1::CompressionSettings& settings,
                                                const std::vector<CallerLayer>& layers,
                                                void* cuda_stream) const;

  /// "cpu" or "gpu".
  const char* backend_name() const { return backend_->name(); }

 private:
  InprocessEngine() = default;

  /// A LayerRequest over the caller's tensors (checked: dtype, strides, memory space).
  absl::StatusOr<LayerRequest> ToRequest(const CallerLayer& layer, const std::string& field,
                                         std::vector<std::shared_ptr<void>>* keep) const;

  EngineOptions options_;
  /// Where the model store's informational lines go: nowhere (a library keeps quiet; its
  /// errors are returned, not logged).
  std::ostream quiet_log_{nullptr};
  PolicyRegistry registry_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PolicyEngine> engine_;
  std::unique_ptr<service::ModelStore> models_;
  std::unique_ptr<ReadyEventPool> ready_events_;  // of options_.device
};

}  // namespace kvtrim::inprocess
