// ListRegions: whether the zero-copy transports are on, every client's leases and regions
// (counts), and the regions of the lease the call names in kvtrim-client-id.
#include <chrono>

#include "service/reactors.h"
#include "service/region_registry.h"
#include "service/rpcs.h"

namespace kvtrim::service {
namespace {

/// Fills `response` from `registry`; NOT_FOUND when `client_id` names no open lease.
absl::Status DescribeRegions(const RegionRegistry& registry, const std::string& client_id,
                             v1::ListRegionsResponse* response) {
  response->set_enabled(registry.options().allow_client_shm);
  response->set_max_regions_per_client(registry.options().max_regions_per_client);
  response->set_leases(registry.clients());
  for (const auto& [kind, count] : registry.CountByKind()) {
    (*response->mutable_regions_by_kind())[RegionKindName(kind)] = count;
  }
  response->set_pinned_shm_bytes(registry.pinned_shm_bytes());
  if (client_id.empty()) return absl::OkStatus();
  auto held = registry.ClientRegions(client_id);
  if (!held.ok()) return held.status();
  for (const auto& region : *held) {
    v1::RegionStatus* status = response->add_regions();
    status->set_region_id(region->id());
    status->set_kind(RegionKindName(region->kind()));
    status->set_size_bytes(region->size_bytes());
    status->set_readers(region->pins());
    status->set_page_locked(region->pinned_base() != nullptr);
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* StartListRegions(ServiceCore& core, grpc::CallbackServerContext* context,
                                           const v1::ListRegionsRequest*,
                                           v1::ListRegionsResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  auto* call = new UnaryCall(core, CallSlot::kNone, *context);
  absl::Status status = call->admitted();
  if (status.ok() && core.regions() != nullptr) {
    // The lease id scoped to the caller's tenant: another tenant's lease is not found.
    status = DescribeRegions(*core.regions(), ServiceCore::ScopedClientId(*context, call->tenant()),
                             response);
  }
  core.metrics().RecordRequest(Rpc::kListRegions, kNoPolicy, status.code(), SecondsSince(start));
  call->Finish(ToGrpcStatus(status));
  return call;
}

}  // namespace kvtrim::service
