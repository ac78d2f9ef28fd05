// Regions a worker registered for the zero-copy transports (host shared memory, CUDA IPC
// allocations and events), per client lease, with pinning while a layer reads them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "service/device_mapper.h"

namespace kvtrim::service {

/// What a region holds.
enum class RegionKind { kHostShm, kCudaIpc, kCudaIpcEvent };

/// "host_shm", "cuda_ipc", "cuda_ipc_event" (messages, metric labels).
const char* RegionKindName(RegionKind kind);

/// One registered region. Its resources (shm descriptor, device mapping, event) are released
/// when the last reference goes: the registry's, and those of layers still reading it.
class Region {
 public:
  Region(RegionKind kind, std::string id, std::string client_id, uint64_t size_bytes)
      : kind_(kind), id_(std::move(id)), client_id_(std::move(client_id)), size_(size_bytes) {}
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  RegionKind kind() const { return kind_; }
  const std::string& id() const { return id_; }
  const std::string& client_id() const { return client_id_; }
  /// Bytes tensors may address (the registered size_bytes; 0 for events).
  uint64_t size_bytes() const { return size_; }
  /// Host shm: the read-only descriptor of the segment.
  int fd() const { return fd_; }
  /// Host shm pinned for the devices' copy engines (RegionOptions::max_pinned_shm_bytes):
  /// the segment's mapping, which only the device reads; null when the segment is read
  /// with pread (no GPU backend, over the cap, or the driver refused).
  const char* pinned_base() const { return pinned_ ? pinned_->base() : nullptr; }
  /// CUDA IPC: the mapped allocation's base in this process.
  const char* device_base() const { return memory_ ? memory_->base() : nullptr; }
  /// CUDA IPC event: the cudaEvent_t (opaque).
  void* event() const { return event_ ? event_->event() : nullptr; }
  /// Layers currently reading the region.
  int pins() const { return pins_.load(); }

  /// Reads of at least twice this many bytes are split over several threads (ReadHost).
  static constexpr size_t kParallelReadBytes = size_t{8} << 20;
  static constexpr size_t kMaxReadThreads = 8;

  /// Reads `bytes` at `offset` of a host shm segment into `dst` (pread: a segment the
  /// client shrank gives an error, never SIGBUS), in contiguous ranges of at least
  /// kParallelReadBytes read by up to kMaxReadThreads threads at once. INVALID_ARGUMENT
  /// naming `field`.
  absl::Status ReadHost(uint64_t offset, void* dst, size_t bytes, const std::string& field) const;
  /// Writes `bytes` from `src` at `offset` of a host shm segment (an output region; pwrite
  /// through a read-write descriptor opened at registration). FAILED_PRECONDITION naming
  /// `field` when kvtrimd could not open the segment for writing.
  absl::Status WriteHost(uint64_t offset, const void* src, size_t bytes,
                         const std::string& field) const;

 private:
  friend class RegionRegistry;
  friend class RegionPin;
  /// One contiguous range of a ReadHost of `total` bytes, `before` bytes into it.
  absl::Status ReadHostRange(uint64_t offset, char* out, size_t bytes, size_t total,
                             size_t before, const std::string& field) const;
  RegionKind kind_;
  std::string id_;
  std::string client_id_;
  uint64_t size_;
  int fd_ = -1;
  int write_fd_ = -1;        // host shm opened read-write (output regions), or -1
  std::string write_error_;  // why it could not be
  std::unique_ptr<MappedDeviceMemory> memory_;
  std::unique_ptr<MappedDeviceEvent> event_;
  std::unique_ptr<PinnedHostMemory> pinned_;
  std::shared_ptr<std::atomic<uint64_t>> pinned_total_;  // the registry's count, when pinned
  std::atomic<int> pins_{0};
};

/// Keeps a region alive and marked in use while a layer reads it (RAII, movable).
class RegionPin {
 public:
  RegionPin() = default;
  explicit RegionPin(std::shared_ptr<Region> region);
  ~RegionPin();
  RegionPin(RegionPin&& other) noexcept = default;
  RegionPin& operator=(RegionPin&& other) noexcept;
  RegionPin(const RegionPin&) = delete;
  RegionPin& operator=(const RegionPin&) = delete;

  const Region* operator->() const { return region_.get(); }
  const Region& operator*() const { return *region_; }

 private:
  std::shared_ptr<Region> region_;
};

/// Limits and switches of the registry (kvtrimd flags).
struct RegionOptions {
  bool allow_client_shm = false;   // --allow_client_shm: off = every region call refused
  int max_regions_per_client = 64; // --max_regions_per_client
  /// --max_pinned_shm_bytes: host shm segments are page-locked for direct device copies
  /// while the pinned segments of all clients stay within this many bytes (0 = never).
  uint64_t max_pinned_shm_bytes = uint64_t{32} << 30;
};

/// All clients' regions. Thread-safe.
class RegionRegistry {
 public:
  /// `mapper` opens CUDA IPC handles on the backend's device; null when kvtrimd computes
  /// on the CPU (CUDA IPC regions are then FAILED_PRECONDITION). Borrowed.
  RegionRegistry(RegionOptions options, DeviceMapper* mapper);

  /// OK when regions are allowed, else FAILED_PRECONDITION naming --allow_client_shm.
  absl::Status CheckEnabled() const;

  /// Starts a lease of `tenant` ("" without tenants) and returns its fresh, unguessable
  /// client id; the registry knows the lease by TenantScopedId(tenant, id).
  std::string OpenClient(const std::string& tenant);
  /// Ends a lease: every region of the client leaves the table at once (their resources go
  /// when the layers reading them finish).
  void CloseClient(const std::string& client_id);

  /// Registers one region for `client_id`; returns its id. Errors name the field
  /// ("register_region.host_shm.name", ".cuda_ipc.device_uuid", ...): INVALID_ARGUMENT for
  /// malformed requests and handles the driver refuses; FAILED_PRECONDITION for CUDA IPC on
  /// a kvtrimd without a GPU backend, or a handle from another device; RESOURCE_EXHAUSTED
  /// past max_regions_per_client; NOT_FOUND for a shm segment that does not exist.
  absl::StatusOr<std::string> Register(const std::string& client_id,
                                       const v1::RegisterRegion& request);
  /// Releases a region of `client_id`. NOT_FOUND when the client holds no such id
  /// (another client's regions are invisible); FAILED_PRECONDITION while a layer reads it.
  absl::Status Unregister(const std::string& client_id, const std::string& region_id);

  /// Pins region `region_id` of kind `kind` for a layer of `client_id`. Errors, naming
  /// `field` (e.g. "layer.keys.cuda_ipc.region_id"): FAILED_PRECONDITION when regions are
  /// off or the call carries no kvtrim-client-id; NOT_FOUND for an unknown id;
  /// PERMISSION_DENIED for another client's region; INVALID_ARGUMENT for a region of
  /// another kind.
  absl::StatusOr<RegionPin> Acquire(const std::string& client_id, const std::string& region_id,
                                    RegionKind kind, const std::string& field) const;

  /// The regions of lease `client_id` (scoped, as Register takes it) in id order; NOT_FOUND
  /// naming kvtrim-client-id when no such lease is open.
  absl::StatusOr<std::vector<std::shared_ptr<const Region>>> ClientRegions(
      const std::string& client_id) const;
  /// Regions registered now, per kind (metrics).
  std::map<RegionKind, int64_t> CountByKind() const;
  /// Open leases (metrics, tests).
  int64_t clients() const;
  /// Bytes of host shm segments pinned now (metrics).
  uint64_t pinned_shm_bytes() const { return pinned_total_->load(); }
  const RegionOptions& options() const { return options_; }

 private:
  /// Pins host shm `region` through the mapper when the cap allows; a refusal is logged and
  /// the region stays a pread region.
  void PinHostShm(Region& region, const std::string& field);

  RegionOptions options_;
  DeviceMapper* mapper_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Region>> regions_;  // by region id
  std::map<std::string, int> clients_;                       // client id -> regions held
  std::shared_ptr<std::atomic<uint64_t>> pinned_total_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

/// The gRPC metadata key that names the calling client's lease.
inline constexpr char kClientIdMetadata[] = "kvtrim-client-id";

}  // namespace kvtrim::service
