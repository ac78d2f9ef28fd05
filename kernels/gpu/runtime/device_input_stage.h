// Staging of one layer's input tensors into device memory the kernels read: host tensors
// are uploaded into the worker's arena (through pinned staging, or by one DMA from a
// page-locked host shm mapping); device tensors (CUDA IPC regions) are read in place when
// dense, or gathered into the arena when strided / paged, after the worker's ready event;
// device and page-locked host tensors are probed for NaN / Inf on the device, beside the
// kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/runtime/device_pool.h"
#include "kernels/gpu/runtime/stage_events.h"
#include "kernels/layer.h"

namespace kvtrim::gpu {

/// Device tensors at addresses that are a multiple of this are read in place.
inline constexpr uintptr_t kInPlaceAlignment = 256;

/// Where one input tensor of a layer is read from on the device.
struct StagedInput {
  const TensorView* view = nullptr;  // the layer's tensor (null when not read)
  const char* name = "";             // "keys", "values", "queries" (messages)
  size_t dense_at = 0;               // arena offset of its dense copy (when it needs one)
  size_t table_at = 0;               // arena offset of its block table (paged only)
  size_t table_bytes = 0;
  bool in_place = false;             // dense, 256-byte aligned device tensor: read where it is
  const void* device_data = nullptr; // set by Stage(): what the kernels read
};

/// The inputs of one layer: arena slots are added while the layout is built (AddSlots),
/// the data is moved once the arena's base is known (Stage).
class DeviceInputStage {
 public:
  /// Adds arena slots for keys / values / queries that the plan reads (`reads_*`), plus
  /// the probe words. Must be called before the pipeline's own regions are added.
  void AddSlots(const ValidatedLayer& layer, bool reads_keys, bool reads_values,
                bool reads_queries, ArenaLayout* layout);

  /// Device pointer the kernels read for input `i` (0 keys, 1 values, 2 queries), given the
  /// arena base; a placeholder (never dereferenced) for inputs not read.
  const void* DevicePointer(int i, char* base) const;

  /// Moves the inputs: waits on the layer's ready event when a device tensor is read,
  /// uploads host tensors, uploads block tables and gathers strided device tensors, and
  /// probes every device tensor for NaN / Inf on the worker's side stream, overlapping the
  /// kernels that follow (their results land in `probe_words`, three words of pinned host
  /// memory; CheckProbes reads them once the context has synchronised). Errors:
  /// INVALID_ARGUMENT "<name>: contains NaN at [a, b, c]" (the engine's host message), or
  /// the CUDA status of a failed call.
  /// With `events`, records StageEvents::kBegin before the wait for the ready event and
  /// kWaited after it.
  /// Inputs whose bit is set in `fused` (1 keys, 2 values, 4 queries) are not probed: the
  /// scorer checks them as it reads them and sets `*finite_flag` (a word of pinned host
  /// memory, cleared here) when one holds a NaN / Inf (FusedFiniteInputs).
  absl::Status Stage(WorkerContext& context, char* base, unsigned long long* probe_words,
                     StageEvents* events = nullptr, uint32_t fused = 0,
                     unsigned int* finite_flag = nullptr);
  /// The device-read inputs (device or page-locked host tensors) present and read: bits as
  /// Stage's `fused`. Valid after AddSlots.
  uint32_t device_read_inputs() const;
  /// After the worker context synchronised: INVALID_ARGUMENT "<name>: contains NaN at
  /// [a, b, c]" (the engine's host message) for the first checked input with a NaN / Inf, in
  /// the order keys, values, queries; OK otherwise (and when Stage probed nothing). When the
  /// scorer's fused check saw one, the inputs it checked are probed now (on `context`'s
  /// stream, synchronously) to find the element.
  absl::Status CheckProbes(WorkerContext& context) const;

 private:
  StagedInput inputs_[3];
  size_t probe_at_ = 0;  // three unsigned long long words
  void* ready_event_ = nullptr;
  const unsigned long long* probe_words_ = nullptr;  // pinned, set by Stage when it probed
  unsigned long long* probe_device_ = nullptr;       // the arena's probe words (Stage)
  uint32_t fused_ = 0;                               // inputs the scorer checks (Stage)
  const volatile unsigned int* finite_flag_ = nullptr;
};

/// A dense host copy of a device or page-locked host tensor (for host-side preparation that
/// reads it, e.g. Expected Attention's window statistics): waits on `ready_event` (may be
/// null), gathers when strided, copies back (a page-locked host tensor through device
/// memory). `out` receives nbytes() bytes (uint32 words, aligned).
absl::Status DownloadDense(WorkerContext& context, const TensorView& view, void* ready_event,
                           std::vector<uint32_t>* out);

}  // namespace kvtrim::gpu
