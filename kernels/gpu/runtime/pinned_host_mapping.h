// A host shared-memory segment mapped into kvtrimd and registered with CUDA, so that the
// GPU's copy engine reads a worker's host tensors straight from the segment (no read into
// kvtrimd's memory, no staging copy). The host CPU never reads the mapping: a client that
// shrinks its segment after registration would make such a read fault (SIGBUS), while the
// copy engine reads the pages the registration pinned.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtrim::gpu {

/// `size_bytes` of the segment open read-only at descriptor `fd`, mapped (mmap, shared,
/// read-only) and page-locked for every CUDA context (cudaHostRegister, portable and
/// read-only). Unregistered and unmapped when destroyed. Thread-safe (immutable).
class PinnedHostMapping {
 public:
  /// Maps and registers; `device` is the ordinal made current for the registration.
  /// Errors: INVALID_ARGUMENT naming `field` when mmap fails or the driver refuses the
  /// registration (a segment shorter than size_bytes, no read-only registration on this
  /// system, locked-memory limits), with the system's or CUDA's reason.
  static absl::StatusOr<std::unique_ptr<PinnedHostMapping>> Map(int device, int fd,
                                                                uint64_t size_bytes,
                                                                const std::string& field);
  ~PinnedHostMapping();
  PinnedHostMapping(const PinnedHostMapping&) = delete;
  PinnedHostMapping& operator=(const PinnedHostMapping&) = delete;

  /// The segment's first byte in this process (a host address the device copies from).
  const char* base() const { return base_; }
  /// Bytes mapped and registered.
  uint64_t bytes() const { return bytes_; }

 private:
  PinnedHostMapping(char* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  char* base_;
  uint64_t bytes_;
};

/// Page-locks kvtrimd's own memory [data, data + bytes) for every CUDA context (portable),
/// `device` made current for the registration, so that the copy engines read it by DMA.
/// False when the driver refuses (locked-memory limits); the memory then stays pageable.
bool LockHostMemory(int device, void* data, size_t bytes);

/// Undoes LockHostMemory (errors are ignored: the memory is about to be freed).
void UnlockHostMemory(void* data);

}  // namespace kvtrim::gpu
