// One backend over several devices of a node: each layer runs on the device that holds its
// tensors, host layers on the least loaded device.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"

namespace kvtrim {

/// Routes every call to one of several backends (one per CUDA device) and is itself a
/// Backend, so the engine and the service see one. A layer with device tensors (CUDA IPC)
/// or a device output target runs on the device that holds them (FAILED_PRECONDITION
/// naming the tensor when they sit on different devices, or on a device this kvtrimd does
/// not serve); a host layer runs on the device with the fewest calls in flight (ties: the
/// next in turn). Model-wide scores kept on a device (LayerScores::resident) are decided by
/// that device, so one model-wide session must keep its device tensors on one device; host
/// layers of model-wide policies always run on the first device. Thread-safe.
class MultiDeviceBackend final : public Backend {
 public:
  /// One served device: its CUDA ordinal and the backend computing on it.
  struct Device {
    int ordinal = 0;
    std::unique_ptr<Backend> backend;
  };
  /// The CUDA ordinal that holds a device address (-1 when unknown).
  using Locator = std::function<int(const void* device_address)>;

  /// `devices` (at least one; ordinals distinct) in the order host layers are dealt to;
  /// `locate` finds the device of a device tensor.
  MultiDeviceBackend(std::vector<Device> devices, Locator locate);

  const char* name() const override;
  absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out) override;
  absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                          const LayerBudget& budget, LayerScores* out) override;
  absl::Status CompressByPerturbation(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                      const LayerBudget& budget, const PerturbationSearch& search,
                                      LayerDecision* out) override;
  absl::Status ScoreLayerForModelWide(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                      const LayerBudget& budget, LayerScores* out) override;
  absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(
      const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) override;
  std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                      const AllocatorSpec& allocator) const override;
  bool reads_device_memory() const override;
  /// False as soon as any device's backend is unhealthy (a sticky error on one GPU stops
  /// the server, as on a single GPU).
  bool healthy() const override;

  /// The served CUDA ordinals, in dealing order.
  std::vector<int> ordinals() const;
  /// Calls in flight on each device (same order as ordinals()).
  std::vector<int> inflight() const;

 private:
  /// The index of the device a layer must run on (`model_wide`: host layers go to the
  /// first device), or the error that names the misplaced tensor.
  absl::StatusOr<size_t> Route(const ValidatedLayer& layer, bool model_wide);
  /// Runs `call` on device `index`, counted in flight.
  absl::Status RunOn(size_t index, const std::function<absl::Status(Backend&)>& call);
  /// Routes `layer` (Route), runs call(backend) there and records the device's ordinal in
  /// out->device (LayerDecision or LayerScores).
  template <typename Out, typename Call>
  absl::Status RunLayer(const ValidatedLayer& layer, bool model_wide, Out* out, Call call) {
    absl::StatusOr<size_t> index = Route(layer, model_wide);
    if (!index.ok()) return index.status();
    return RunOn(*index, [&](Backend& backend) {
      absl::Status status = call(backend);
      out->device = devices_[*index].ordinal;
      return status;
    });
  }

  std::vector<Device> devices_;
  Locator locate_;
  std::unique_ptr<std::atomic<int>[]> inflight_;  // per device
  std::atomic<size_t> next_{0};                    // round-robin among the least loaded
};

}  // namespace kvtrim
