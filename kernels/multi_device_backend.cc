#include "kernels/multi_device_backend.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtrim {

MultiDeviceBackend::MultiDeviceBackend(std::vector<Device> devices, Locator locate)
    : devices_(std::move(devices)),
      locate_(std::move(locate)),
      inflight_(new std::atomic<int>[devices_.size()]) {
  for (size_t i = 0; i < devices_.size(); ++i) inflight_[i].store(0);
}

const char* MultiDeviceBackend::name() const { return devices_.front().backend->name(); }

std::vector<int> MultiDeviceBackend::ordinals() const {
  std::vector<int> out;
  for (const Device& device : devices_) out.push_back(device.ordinal);
  return out;
}

std::vector<int> MultiDeviceBackend::inflight() const {
  std::vector<int> out;
  for (size_t i = 0; i < devices_.size(); ++i) out.push_back(inflight_[i].load());
  return out;
}

absl::StatusOr<size_t> MultiDeviceBackend::Route(const ValidatedLayer& layer, bool model_wide) {
  const std::pair<const void*, const char*> placed[] = {
      {layer.keys.on_device() ? layer.keys.data : nullptr, "keys"},
      {layer.values.present() && layer.values.on_device() ? layer.values.data : nullptr,
       "values"},
      {layer.queries.present() && layer.queries.on_device() ? layer.queries.data : nullptr,
       "queries"},
      {layer.output.device, "output"}};
  bool located = false;
  int ordinal = -1;
  const char* first = nullptr;
  for (const auto& [address, name] : placed) {
    if (address == nullptr) continue;
    const int here = locate_(address);
    if (located && here != ordinal) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer.", name, ": on CUDA device ", here, " but layer.", first, " is on device ",
          ordinal, "; one layer's tensors and output must live on one GPU"));
    }
    located = true;
    ordinal = here;
    first = name;
  }
  if (located) {
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i].ordinal == ordinal) return i;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "layer.", first, ": on CUDA device ", ordinal, ", which this kvtrimd does not serve "
        "(--devices=", absl::StrJoin(ordinals(), ","), ")"));
  }
  if (model_wide) return size_t{0};
  // A host layer: the least loaded device, the next in turn among equals.
  const size_t start = next_.fetch_add(1) % devices_.size();
  size_t best = start;
  int best_load = std::numeric_limits<int>::max();
  for (size_t k = 0; k < devices_.size(); ++k) {
    const size_t i = (start + k) % devices_.size();
    const int load = inflight_[i].load();
    if (load < best_load) {
      best = i;
      best_load = load;
    }
  }
  return best;
}

absl::Status MultiDeviceBackend::RunOn(size_t index,
                                       const std::function<absl::Status(Backend&)>& call) {
  inflight_[index].fetch_add(1);
  absl::Status status = call(*devices_[index].backend);
  inflight_[index].fetch_sub(1);
  return status;
}

absl::Status MultiDeviceBackend::CompressLayer(const ResolvedPolicy& policy,
                                               const ValidatedLayer& layer,
                                               const LayerBudget& budget, LayerDecision* out) {
  return RunLayer(layer, /*model_wide=*/false, out,
                  [&](Backend& backend) {
                    return backend.CompressLayer(policy, layer, budget, out);
                  });
}

absl::Status MultiDeviceBackend::CompressByPerturbation(const ResolvedPolicy& policy,
                                                        const ValidatedLayer& layer,
                                                        const LayerBudget& budget,
                                                        const PerturbationSearch& search,
                                                        LayerDecision* out) {
  return RunLayer(layer, /*model_wide=*/false, out, [&](Backend& backend) {
    return backend.CompressByPerturbation(policy, layer, budget, search, out);
  });
}

absl::Status MultiDeviceBackend::ScoreLayer(const ResolvedPolicy& policy,
                                            const ValidatedLayer& layer,
                                            const LayerBudget& budget, LayerScores* out) {
  return RunLayer(layer, /*model_wide=*/false, out,
                  [&](Backend& backend) {
                    return backend.ScoreLayer(policy, layer, budget, out);
                  });
}

absl::Status MultiDeviceBackend::ScoreLayerForModelWide(const ResolvedPolicy& policy,
                                                        const ValidatedLayer& layer,
                                                        const LayerBudget& budget,
                                                        LayerScores* out) {
  return RunLayer(layer, /*model_wide=*/true, out,
                  [&](Backend& backend) {
                    return backend.ScoreLayerForModelWide(policy, layer, budget, out);
                  });
}

absl::StatusOr<std::vector<LayerDecision>> MultiDeviceBackend::DecideModelWide(
    const ResolvedPolicy& policy, const std::vector<LayerScores>& layers) {
  // The device that holds resident scores decides; host scores can go anywhere (the first).
  int ordinal = -1;
  for (const LayerScores& layer : layers) {
    if (layer.resident == nullptr) continue;
    if (ordinal >= 0 && layer.device != ordinal) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", layer.layer_id, ": its scores are on CUDA device ", layer.device,
          " but earlier layers' on device ", ordinal, "; a model-wide session must keep its "
          "tensors on one GPU"));
    }
    ordinal = layer.device;
  }
  size_t index = 0;
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i].ordinal == ordinal) index = i;
  }
  absl::StatusOr<std::vector<LayerDecision>> decisions;
  absl::Status status = RunOn(index, [&](Backend& backend) {
    decisions = backend.DecideModelWide(policy, layers);
    return decisions.status();
  });
  if (!status.ok()) return status;
  for (LayerDecision& decision : *decisions) decision.device = devices_[index].ordinal;
  return decisions;
}

std::vector<Numerics> MultiDeviceBackend::NumericsModes(const ScorerSpec& scorer,
                                                        const AllocatorSpec& allocator) const {
  return devices_.front().backend->NumericsModes(scorer, allocator);
}

bool MultiDeviceBackend::reads_device_memory() const {
  return devices_.front().backend->reads_device_memory();
}

bool MultiDeviceBackend::healthy() const {
  for (const Device& device : devices_) {
    if (!device.backend->healthy()) return false;
  }
  return true;
}

}  // namespace kvtrim
