// The client side of the Regions stream: a lease under which a worker registers its own
// memory (POSIX shared memory, CUDA IPC device buffers and events) with kvtrimd, so that
// layers can name tensors inside it instead of carrying their bytes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"

namespace kvtrim {

/// gRPC metadata key carrying a RegionLease's client id on Compress / CompressSession calls.
inline constexpr char kClientIdMetadataKey[] = "kvtrim-client-id";
/// The gRPC metadata key of a bearer token (value "Bearer <token>", kvtrimd's
/// --auth_tokens_file).
inline constexpr char kAuthorizationMetadataKey[] = "authorization";

/// One open Regions stream. Its lifetime is the lease: kvtrimd releases every region
/// registered on it when the stream ends (Close, destruction, cancellation, a crash).
/// Calls that use the regions must carry the lease's client_id as gRPC metadata
/// `kvtrim-client-id` (Client::SetClientId). Thread-safe: requests from several threads are
/// sent one at a time. The stream has no deadline.
class RegionLease {
 public:
  using Stream = grpc::ClientReaderWriterInterface<v1::RegionRequest, v1::RegionResponse>;

  /// Opens a Regions stream on `stub` (which must outlive the lease) and reads the lease
  /// the server answers first. The stream's gRPC status when it fails (e.g.
  /// FAILED_PRECONDITION naming --allow_client_shm when the server does not allow
  /// regions); INTERNAL when the first answer carries no lease. `authorization`: the
  /// `authorization` metadata to send ("Bearer <token>"; empty: none).
  static absl::StatusOr<std::unique_ptr<RegionLease>> Open(
      v1::Kvtrim::StubInterface* stub, const std::string& authorization = "");

  /// Closes the stream when Close was not called (cancelling it: no waiting on the server).
  ~RegionLease();
  RegionLease(const RegionLease&) = delete;
  RegionLease& operator=(const RegionLease&) = delete;

  /// The id to send as `kvtrim-client-id` metadata on calls using this lease's regions.
  const std::string& client_id() const { return client_id_; }
  /// The server's --max_regions_per_client, as the lease reported it.
  int32_t max_regions() const { return max_regions_; }

  /// Registers the host shared-memory segment `name` (see SharedMemorySegment), of which
  /// tensors may address the first `size_bytes` bytes. Returns the region id.
  absl::StatusOr<std::string> RegisterHostShm(const std::string& name, uint64_t size_bytes);

  /// Registers a cudaMalloc allocation by its 64-byte cudaIpcMemHandle_t `handle64`, the
  /// worker's device ordinal `device` and that device's 16-byte uuid `uuid16`; tensors may
  /// address the first `size_bytes` bytes from the allocation's base. Returns the region id.
  absl::StatusOr<std::string> RegisterCudaIpc(const std::string& handle64, int device,
                                              const std::string& uuid16, uint64_t size_bytes);

  /// Registers an interprocess CUDA event by its 64-byte cudaIpcEventHandle_t and its
  /// device's 16-byte uuid. Returns the id LayerInput.ready_event_id names.
  absl::StatusOr<std::string> RegisterCudaIpcEvent(const std::string& handle64,
                                                   const std::string& uuid16);

  /// Releases one region of this lease (NOT_FOUND for an id it does not hold,
  /// FAILED_PRECONDITION while a running layer reads it).
  absl::Status Unregister(const std::string& region_id);

  /// Ends the stream (WritesDone, then the server's final status), releasing every region.
  /// Later requests fail FAILED_PRECONDITION. Calling it again returns the same status.
  absl::Status Close();

 private:
  RegionLease() = default;

  /// Sends `request` with a fresh tag and returns the answer of the same tag; the answer's
  /// own code and message when it failed; the stream's status when the stream ended.
  absl::StatusOr<v1::RegionResponse> Call(v1::RegionRequest request);
  /// Ends the stream after it failed or was cancelled: drains replies, collects the
  /// status. Caller holds mu_.
  absl::Status EndStream();

  std::string client_id_;
  int32_t max_regions_ = 0;

  std::mutex mu_;  // one request at a time; guards everything below
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<Stream> stream_;
  uint64_t next_tag_ = 1;
  bool closed_ = false;
  absl::Status final_status_;
};

}  // namespace kvtrim
