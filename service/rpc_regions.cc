// Regions: the lease stream of the zero-copy transports. An idle lease holds no thread:
// requests are served on the work pool as they arrive, and the lease (every region
// registered through it) ends with the stream.
#include <chrono>
#include <memory>
#include <string>

#include "service/reactors.h"
#include "service/rpcs.h"

namespace kvtrim::service {

namespace {

/// The reactor of one Regions call: one lease, counted against --max_leases.
class RegionsCall final : public BidiStream<v1::RegionRequest, v1::RegionResponse> {
 public:
  RegionsCall(ServiceCore& core, const grpc::CallbackServerContext& context)
      : core_(core), guard_(core, CallSlot::kLease, context), lane_(core.pool()) {
    absl::Status status = guard_.status();
    if (status.ok()) {
      status = core_.regions() == nullptr
                   ? absl::FailedPreconditionError(
                         "regions: this kvtrimd serves no regions; send inline_data")
                   : core_.regions()->CheckEnabled();
    }
    if (!status.ok()) {
      End(status);
      return;
    }
    const std::string client_id = core_.regions()->OpenClient(guard_.tenant());
    lease_key_ = TenantScopedId(guard_.tenant(), client_id);
    core_.PublishRegionMetrics();
    v1::RegionResponse first;
    first.mutable_lease()->set_client_id(client_id);
    first.mutable_lease()->set_max_regions(core_.regions()->options().max_regions_per_client);
    Send(std::move(first));
    RequestRead();
  }

  ~RegionsCall() override {
    // Every region of the lease goes when the stream ends, however it ends.
    if (!lease_key_.empty()) {
      core_.regions()->CloseClient(lease_key_);
      core_.PublishRegionMetrics();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Client half-close ends the lease normally; cancellation / deadline too.
      End(absl::OkStatus());
      return;
    }
    auto request = std::make_shared<v1::RegionRequest>(std::move(incoming_));
    incoming_.Clear();
    Hold();
    // Opening a CUDA IPC handle or a segment may block: off gRPC's thread.
    lane_.Post([this, request] {
      Send(Answer(*request));
      RequestRead();
      Release();
    });
  }

 private:
  /// The answer to one request, with its own status.
  v1::RegionResponse Answer(const v1::RegionRequest& request) {
    v1::RegionResponse response;
    response.set_tag(request.tag());
    absl::Status result;
    RegionRegistry& regions = *core_.regions();
    switch (request.message_case()) {
      case v1::RegionRequest::kRegisterRegion: {
        auto id = regions.Register(lease_key_, request.register_region());
        if (id.ok()) {
          response.set_registered_region_id(*id);
        } else {
          result = id.status();
        }
        break;
      }
      case v1::RegionRequest::kUnregisterRegion:
        result = regions.Unregister(lease_key_, request.unregister_region().region_id());
        if (result.ok()) {
          response.set_unregistered_region_id(request.unregister_region().region_id());
        }
        break;
      default:
        result = absl::InvalidArgumentError(
            "message: empty RegionRequest; set register_region or unregister_region");
    }
    response.set_code(static_cast<int32_t>(result.code()));
    response.set_message(std::string(result.message()));
    core_.PublishRegionMetrics();
    return response;
  }

  /// Records the call and finishes it with `status` (once).
  void End(const absl::Status& status) {
    if (ended_.exchange(true)) return;
    core_.metrics().RecordRequest(Rpc::kRegions, kNoPolicy, status.code(), SecondsSince(start_));
    FinishAfterWrites(ToGrpcStatus(status));
  }

  ServiceCore& core_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  CallGuard guard_;
  SerialLane lane_;
  std::string lease_key_;  // the lease's client id scoped to its tenant (TenantScopedId)
  std::atomic<bool> ended_{false};
};

}  // namespace

grpc::ServerBidiReactor<v1::RegionRequest, v1::RegionResponse>* StartRegions(
    ServiceCore& core, grpc::CallbackServerContext* context) {
  return new RegionsCall(core, *context);
}

}  // namespace kvtrim::service
