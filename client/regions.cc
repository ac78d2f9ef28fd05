#include "client/regions.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/grpc_status.h"

namespace kvtrim {
namespace {

/// The status of one RegionResponse: its google.rpc.Code and message (an unknown code
/// becomes UNKNOWN, keeping the number in the message).
absl::Status ResponseStatus(const v1::RegionResponse& response) {
  const int32_t code = response.code();
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > 16) {
    return absl::UnknownError(
        absl::StrCat("Regions: answer code ", code, ": ", response.message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), response.message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegionLease>> RegionLease::Open(
    v1::Kvtrim::StubInterface* stub, const std::string& authorization) {
  if (stub == nullptr) return absl::InvalidArgumentError("stub: must not be null");
  std::unique_ptr<RegionLease> lease(new RegionLease());
  lease->context_ = std::make_unique<grpc::ClientContext>();
  if (!authorization.empty()) {
    lease->context_->AddMetadata(kAuthorizationMetadataKey, authorization);
  }
  lease->stream_ = stub->Regions(lease->context_.get());
  v1::RegionResponse first;
  if (!lease->stream_->Read(&first)) {
    std::lock_guard<std::mutex> lock(lease->mu_);
    absl::Status status = lease->EndStream();
    if (status.code() == absl::StatusCode::kUnimplemented && status.message().empty()) {
      return absl::UnimplementedError(
          "Regions: the server does not serve this RPC (a kvtrimd without zero-copy "
          "transports)");
    }
    if (!status.ok()) return status;
    return absl::InternalError("Regions: the stream ended before the server sent the lease");
  }
  // Any failure below leaves the stream open: the destructor cancels it.
  KVTRIM_RETURN_IF_ERROR(ResponseStatus(first));
  if (!first.has_lease()) {
    return absl::InternalError("Regions: the first answer carries no `lease`");
  }
  if (first.lease().client_id().empty()) {
    return absl::InternalError("Regions: lease.client_id is empty");
  }
  lease->client_id_ = first.lease().client_id();
  lease->max_regions_ = first.lease().max_regions();
  return lease;
}

RegionLease::~RegionLease() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || stream_ == nullptr) return;
  context_->TryCancel();
  EndStream().IgnoreError();
}

absl::Status RegionLease::EndStream() {
  if (closed_) return final_status_;
  closed_ = true;
  v1::RegionResponse ignored;
  while (stream_->Read(&ignored)) {
  }
  final_status_ = FromGrpcStatus(stream_->Finish());
  return final_status_;
}

absl::StatusOr<v1::RegionResponse> RegionLease::Call(v1::RegionRequest request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) {
    return absl::FailedPreconditionError("Regions: the lease is closed (its regions are released)");
  }
  const uint64_t tag = next_tag_++;
  request.set_tag(tag);
  auto stream_ended = [this] {
    absl::Status status = EndStream();
    if (!status.ok()) return status;
    return absl::UnavailableError(
        "Regions: the server ended the lease stream (its regions are released)");
  };
  if (!stream_->Write(request)) return stream_ended();
  v1::RegionResponse response;
  while (stream_->Read(&response)) {
    if (response.tag() != tag) continue;  // not ours: an answer to an abandoned request
    KVTRIM_RETURN_IF_ERROR(ResponseStatus(response));
    return response;
  }
  return stream_ended();
}

absl::StatusOr<std::string> RegionLease::RegisterHostShm(const std::string& name,
                                                         uint64_t size_bytes) {
  v1::RegionRequest request;
  v1::HostShmRegion* region = request.mutable_register_region()->mutable_host_shm();
  region->set_name(name);
  region->set_size_bytes(size_bytes);
  absl::StatusOr<v1::RegionResponse> response = Call(std::move(request));
  if (!response.ok()) return response.status();
  if (response->registered_region_id().empty()) {
    return absl::InternalError("Regions: register_region answered without a region id");
  }
  return response->registered_region_id();
}

absl::StatusOr<std::string> RegionLease::RegisterCudaIpc(const std::string& handle64, int device,
                                                         const std::string& uuid16,
                                                         uint64_t size_bytes) {
  v1::RegionRequest request;
  v1::CudaIpcRegion* region = request.mutable_register_region()->mutable_cuda_ipc();
  region->set_handle(handle64);
  region->set_device(device);
  region->set_device_uuid(uuid16);
  region->set_size_bytes(size_bytes);
  absl::StatusOr<v1::RegionResponse> response = Call(std::move(request));
  if (!response.ok()) return response.status();
  if (response->registered_region_id().empty()) {
    return absl::InternalError("Regions: register_region answered without a region id");
  }
  return response->registered_region_id();
}

absl::StatusOr<std::string> RegionLease::RegisterCudaIpcEvent(const std::string& handle64,
                                                              const std::string& uuid16) {
  v1::RegionRequest request;
  v1::CudaIpcEvent* event = request.mutable_register_region()->mutable_cuda_ipc_event();
  event->set_handle(handle64);
  event->set_device_uuid(uuid16);
  absl::StatusOr<v1::RegionResponse> response = Call(std::move(request));
  if (!response.ok()) return response.status();
  if (response->registered_region_id().empty()) {
    return absl::InternalError("Regions: register_region answered without a region id");
  }
  return response->registered_region_id();
}

absl::Status RegionLease::Unregister(const std::string& region_id) {
  v1::RegionRequest request;
  request.mutable_unregister_region()->set_region_id(region_id);
  return Call(std::move(request)).status();
}

absl::Status RegionLease::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return final_status_;
  stream_->WritesDone();  // a failure here means the stream already ended: Finish says how
  return EndStream();
}

}  // namespace kvtrim
