#include "service/service_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "service/memory_return.h"
#include "service/response_codec.h"

namespace kvtrim::service {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status CheckCallAlive(const grpc::ServerContextBase& context, const std::string& before) {
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline exceeded before ", before, "; no further work was done"));
  }
  if (context.IsCancelled()) {
    return absl::CancelledError(absl::StrCat("call cancelled by the client before ", before));
  }
  return absl::OkStatus();
}

ServiceCore::ServiceCore(const PolicyEngine& engine, const Backend& backend, Metrics& metrics,
                         ModelStore& models, ServiceOptions options, std::ostream* error_log)
    : engine_(engine),
      metrics_(metrics),
      models_(models),
      options_{std::max(1, options.max_inflight), std::max(1, options.max_leases),
               std::max(std::chrono::milliseconds(0), options.admission_wait),
               options.default_numerics, options.tokens},
      error_log_(error_log),
      inflight_(options_.max_inflight, options_.max_inflight),
      leases_(options_.max_leases, 0) {
  // An admitted session runs its front end, its compute lane and its layer jobs (two by
  // default, --session_parallel_layers) at once; the rest is model registration. Past the
  // cap, tasks queue: none of them waits for a queued one, so the cap bounds threads, not
  // progress. Calls waiting for admission (at most max_inflight) block a thread each on
  // top of that.
  pool_ = std::make_unique<WorkPool>(5 * options_.max_inflight + 16);
  EncodePolicies(engine_.registry(), backend, &policies_);
  for (const auto& info : policies_.policies()) policy_names_.insert(info.name());
}

void ServiceCore::SetTransports(RegionRegistry* regions, TransportOptions options) {
  regions_ = regions;
  transport_options_ = options;
  buffers_ = options.host_buffer_pool_bytes > 0
                 ? std::make_shared<HostBufferPool>(options.host_buffer_pool_bytes,
                                                    size_t{1} << 20, options.buffer_locker,
                                                    options.max_pinned_buffer_bytes,
                                                    options.host_buffer_idle)
                 : nullptr;
}

size_t ServiceCore::ExpireIdleBuffers() {
  return buffers_ != nullptr ? buffers_->ExpireIdle() : 0;
}

void ServiceCore::PublishMemoryMetrics() {
  const HeapUsage heap = ReadHeapUsage();
  metrics_.SetHeapBytes(heap.in_use_bytes, heap.free_bytes, heap.mmapped_bytes);
  if (buffers_ != nullptr) {
    metrics_.SetHostBufferBytes(buffers_->idle_bytes(), buffers_->in_use_bytes());
  }
}

std::string ServiceCore::PolicyLabel(const std::string& name) const {
  return policy_names_.count(name) != 0 ? name : std::string(kInvalidPolicy);
}

void ServiceCore::LogServerError(Rpc rpc, const std::string& request_id,
                                 const absl::Status& status) {
  const auto code = status.code();
  if (code != absl::StatusCode::kInternal && code != absl::StatusCode::kUnknown &&
      code != absl::StatusCode::kDataLoss) {
    return;
  }
  // The client's id is bounded and escaped: one log line, whatever it sent.
  LogLine(absl::StrCat("kvtrimd: ", RpcName(rpc), " request_id=", QuoteClientText(request_id),
                       " failed: ", status.ToString()));
}

void ServiceCore::LogLine(const std::string& line) {
  if (error_log_ == nullptr) return;
  std::lock_guard<std::mutex> lock(log_mutex_);
  *error_log_ << line << std::endl;
}

void ServiceCore::ReportBackendFailure(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInternal && backend_failure_hook_) {
    backend_failure_hook_(status);
  }
}

absl::StatusOr<ResolvedPolicy> PreparePolicyWithModel(const PolicyEngine& engine,
                                                      ModelStore& models,
                                                      const CompressionSettings& settings,
                                                      const std::string& field) {
  const std::string& model_digest = settings.model_digest;
  auto policy = engine.Prepare(settings, field);
  if (!policy.ok()) return policy.status();
  std::shared_ptr<const RegisteredModel> model;
  if (!model_digest.empty()) {
    model = models.FindOrLoad(model_digest);
    if (model == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ".model_digest: unknown model digest ",
                       QuoteClientText(model_digest),
                       "; register the model (RegisterModel) and retry"));
    }
  }
  KVTRIM_RETURN_IF_ERROR(engine.AttachModel(&*policy, std::move(model), field));
  return policy;
}

absl::StatusOr<ResolvedPolicy> ServiceCore::PreparePolicy(const CompressionSettings& settings,
                                                          const std::string& field) {
  return PreparePolicyWithModel(engine_, models_, settings, field);
}

std::string ServiceCore::ScopedClientId(const grpc::ServerContextBase& context,
                                        const std::string& tenant) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientIdMetadata);
  if (it == metadata.end()) return "";
  return TenantScopedId(tenant, std::string(it->second.data(), it->second.size()));
}

DecodeContext ServiceCore::MakeDecodeContext(const grpc::ServerContextBase& context,
                                             const std::string& tenant) const {
  DecodeContext decode;
  decode.regions = regions_;
  decode.buffers = buffers_;
  decode.max_host_read_bytes = transport_options_.max_layer_bytes;
  decode.client_id = ScopedClientId(context, tenant);
  return decode;
}

void ServiceCore::CountTransportBytes(const TransportBytes& bytes) {
  metrics_.AddTransportBytes(Transport::kInline, bytes.inline_bytes);
  metrics_.AddTransportBytes(Transport::kHostShm, bytes.host_shm);
  metrics_.AddTransportBytes(Transport::kCudaIpc, bytes.cuda_ipc);
  if (buffers_ != nullptr) {
    metrics_.SetPinnedBufferBytes(buffers_->locked_bytes());
    metrics_.SetHostBufferBytes(buffers_->idle_bytes(), buffers_->in_use_bytes());
  }
}

void ServiceCore::PublishRegionMetrics() {
  if (regions_ == nullptr) return;
  const auto counts = regions_->CountByKind();
  metrics_.SetRegions(counts.at(RegionKind::kHostShm), counts.at(RegionKind::kCudaIpc),
                      counts.at(RegionKind::kCudaIpcEvent), regions_->clients(),
                      regions_->pinned_shm_bytes());
}

void ServiceCore::StartDraining() {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  draining_ = true;
}

bool ServiceCore::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(calls_mutex_);
  return calls_idle_.wait_until(lock, deadline, [this] { return active_calls_ == 0; });
}

namespace {

/// The refusal of a Compress / CompressSession call for want of a --max_inflight slot.
absl::Status InflightRefusal(int max_inflight, std::chrono::milliseconds waited) {
  if (waited.count() == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_inflight: ", max_inflight,
        " Compress/CompressSession calls are already in flight; retry with backoff"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "max_inflight: ", max_inflight, " Compress/CompressSession calls stayed in flight for ",
      "the whole admission wait (--admission_wait_ms=", waited.count(),
      "); retry with backoff"));
}

}  // namespace

CallGuard::CallGuard(ServiceCore& core, CallSlot slot, const grpc::ServerContextBase& context)
    : core_(core), slot_(slot) {
  if (core_.options_.tokens != nullptr) {
    auto tenant = core_.options_.tokens->TenantOf(context);
    if (!tenant.ok()) {
      status_ = tenant.status();
      return;
    }
    tenant_ = *std::move(tenant);
  }
  {
    std::lock_guard<std::mutex> lock(core_.calls_mutex_);
    if (core_.draining_) {
      status_ = absl::UnavailableError(
          "draining: kvtrimd is shutting down and accepts no new calls; retry on another "
          "replica");
      return;
    }
    if (slot_ != CallSlot::kLease) {
      ++core_.active_calls_;
      counted_ = true;
    }
  }
  switch (slot_) {
    case CallSlot::kNone:
      return;
    case CallSlot::kInflight:
      admitted_ = core_.inflight_.TryAcquire();
      if (admitted_) {
        core_.metrics_.InflightChanged(+1);
      } else if (core_.options_.admission_wait.count() > 0 &&
                 core_.inflight_.StartWaiting()) {
        waiting_ = true;  // AwaitSlot decides
      } else {
        status_ = InflightRefusal(core_.options_.max_inflight, std::chrono::milliseconds(0));
      }
      return;
    case CallSlot::kLease:
      admitted_ = core_.leases_.TryAcquire();
      if (!admitted_) {
        status_ = absl::ResourceExhaustedError(absl::StrCat(
            "max_leases: ", core_.options_.max_leases,
            " Regions leases are already held; close an idle lease or retry with backoff"));
      }
      return;
  }
}

const absl::Status& CallGuard::AwaitSlot(const grpc::ServerContextBase& context) {
  if (slot_ != CallSlot::kInflight || !status_.ok()) return status_;
  if (waiting_) {
    waiting_ = false;
    const auto wait = core_.options_.admission_wait;
    const bool taken = core_.inflight_.AwaitSlot(
        arrived_ + wait, [&context] { return context.IsCancelled(); });
    if (taken) {
      admitted_ = true;
      core_.metrics_.InflightChanged(+1);
      // A cancellation seen before the slot was taken found nothing to release (OnCancel).
      if (context.IsCancelled()) ReleaseSlot();
    }
    if (auto alive = CheckCallAlive(context, "admission"); !alive.ok()) {
      status_ = alive;
    } else if (!taken) {
      status_ = InflightRefusal(core_.options_.max_inflight, wait);
    }
  }
  core_.metrics_.ObserveStage(Stage::kAdmission, SecondsSince(arrived_));
  return status_;
}

void CallGuard::ReleaseSlot() {
  if (!admitted_.exchange(false)) return;
  if (slot_ == CallSlot::kInflight) {
    core_.inflight_.Release();
    core_.metrics_.InflightChanged(-1);
  } else {
    core_.leases_.Release();
  }
}

CallGuard::~CallGuard() {
  if (waiting_) core_.inflight_.StopWaiting();  // AwaitSlot never ran
  ReleaseSlot();
  if (counted_) {
    std::lock_guard<std::mutex> lock(core_.calls_mutex_);
    if (--core_.active_calls_ == 0) core_.calls_idle_.notify_all();
  }
}

}  // namespace kvtrim::service
