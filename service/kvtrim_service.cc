#include "service/kvtrim_service.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/model_codec.h"
#include "service/response_codec.h"
#include "service/session_reader.h"
#include "service/settings_codec.h"
#include "service/status.h"
#include "service/tensor_codec.h"

namespace kvtrim::service {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Encodes `decision` into `out` and, when the settings ask for it, its per-stage times with
/// the encode time and the server time since `received`. Returns the encode seconds.
double EncodeAnswer(const CompressionSettings& settings, Clock::time_point received,
                    LayerDecision* decision, v1::LayerResult* out) {
  const auto start = Clock::now();
  EncodeLayerResult(*decision, out, settings.packed_answer);
  const double encode = SecondsSince(start);
  if (settings.profile) {
    decision->profile.encode = encode;
    decision->profile.server = SecondsSince(received);
    EncodeLayerProfile(decision->profile, out->mutable_profile());
  }
  return encode;
}

}  // namespace

/// One admission slot: acquired in the constructor when fewer than max_inflight calls are
/// in flight; released in the destructor.
class KvtrimService::Admission {
 public:
  explicit Admission(KvtrimService& service) : service_(service) {
    int current = service_.inflight_.load();
    while (current < service_.max_inflight_) {
      if (service_.inflight_.compare_exchange_weak(current, current + 1)) {
        admitted_ = true;
        service_.metrics_.InflightChanged(+1);
        return;
      }
    }
  }
  ~Admission() {
    if (admitted_) {
      service_.inflight_.fetch_sub(1);
      service_.metrics_.InflightChanged(-1);
    }
  }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  /// OK when admitted, else RESOURCE_EXHAUSTED naming max_inflight.
  absl::Status status() const {
    if (admitted_) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_inflight: ", service_.max_inflight_,
        " Compress/CompressSession calls are already in flight; retry with backoff"));
  }

 private:
  KvtrimService& service_;
  bool admitted_ = false;
};

/// Registers a running handler with the service (for WaitIdle), or refuses it while the
/// service is draining.
class KvtrimService::CallScope {
 public:
  explicit CallScope(KvtrimService& service) : service_(service) {
    std::lock_guard<std::mutex> lock(service_.calls_mutex_);
    refused_ = service_.draining_;
    if (!refused_) ++service_.active_calls_;
  }
  ~CallScope() {
    if (refused_) return;
    std::lock_guard<std::mutex> lock(service_.calls_mutex_);
    if (--service_.active_calls_ == 0) service_.calls_idle_.notify_all();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

  /// OK, or UNAVAILABLE when the server is draining.
  absl::Status status() const {
    if (!refused_) return absl::OkStatus();
    return absl::UnavailableError(
        "draining: kvtrimd is shutting down and accepts no new calls; retry on another replica");
  }

 private:
  KvtrimService& service_;
  bool refused_ = false;
};

void KvtrimService::StartDraining() {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  draining_ = true;
}

bool KvtrimService::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(calls_mutex_);
  return calls_idle_.wait_until(lock, deadline, [this] { return active_calls_ == 0; });
}

absl::Status CheckCallAlive(const grpc::ServerContext& context, const std::string& before) {
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline exceeded before ", before, "; no further work was done"));
  }
  if (context.IsCancelled()) {
    return absl::CancelledError(absl::StrCat("call cancelled by the client before ", before));
  }
  return absl::OkStatus();
}

KvtrimService::KvtrimService(const PolicyEngine& engine, const Backend& backend,
                             Metrics& metrics, ModelStore& models, Options options,
                             std::ostream* error_log)
    : engine_(engine),
      metrics_(metrics),
      models_(models),
      max_inflight_(std::max(1, options.max_inflight)),
      default_numerics_(options.default_numerics),
      error_log_(error_log) {
  EncodePolicies(engine_.registry(), backend, &policies_);
  for (const auto& info : policies_.policies()) policy_names_.insert(info.name());
}

void KvtrimService::LogServerError(Rpc rpc, const std::string& request_id,
                                   const absl::Status& status) {
  const auto code = status.code();
  if (error_log_ == nullptr || (code != absl::StatusCode::kInternal &&
                                code != absl::StatusCode::kUnknown &&
                                code != absl::StatusCode::kDataLoss)) {
    return;
  }
  std::lock_guard<std::mutex> lock(log_mutex_);
  *error_log_ << "kvtrimd: " << RpcName(rpc) << " request_id='" << request_id
              << "' failed: " << status << std::endl;
}

std::string KvtrimService::PolicyLabel(const std::string& name) const {
  return policy_names_.count(name) != 0 ? name : std::string(kInvalidPolicy);
}

grpc::Status KvtrimService::ListPolicies(grpc::ServerContext* context,
                                         const v1::ListPoliciesRequest* request,
                                         v1::ListPoliciesResponse* response) {
  const auto start = Clock::now();
  CallScope scope(*this);
  const absl::Status status = scope.status();
  if (status.ok()) *response = policies_;
  metrics_.RecordRequest(Rpc::kListPolicies, kNoPolicy, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

absl::StatusOr<ResolvedPolicy> KvtrimService::PreparePolicy(const CompressionSettings& settings,
                                                            const std::string& field) {
  const std::string& model_digest = settings.model_digest;
  auto policy = engine_.Prepare(settings, field);
  if (!policy.ok()) return policy.status();
  std::shared_ptr<const RegisteredModel> model;
  if (!model_digest.empty()) {
    model = models_.Find(model_digest);
    if (model == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".model_digest: unknown model digest '", model_digest,
          "'; register the model (RegisterModel) and retry"));
    }
  }
  if (auto st = engine_.AttachModel(&*policy, std::move(model), field); !st.ok()) return st;
  return policy;
}

absl::StatusOr<LayerDecision> KvtrimService::ComputeLayer(const ResolvedPolicy& policy,
                                                          const LayerRequest& layer,
                                                          const std::string& field) {
  const auto start = Clock::now();
  auto decision = engine_.CompressLayer(policy, layer, field);
  const double wall = SecondsSince(start);
  if (!decision.ok()) return ComputeFailed(decision.status(), 0, start);
  const double compute = std::min(wall, std::max(0.0, decision->compute_seconds));
  metrics_.ObserveStage(Stage::kCompute, compute);
  metrics_.ObserveStage(Stage::kValidate, wall - compute);
  decision->profile.validate = wall - compute;
  return decision;
}

absl::Status KvtrimService::ScoreForModelWide(const ResolvedPolicy& policy,
                                               const LayerRequest& layer,
                                               const std::string& field,
                                               ModelWideScores* buffered) {
  const auto start = Clock::now();
  double compute = 0;
  auto scores = engine_.ScoreLayer(policy, layer, field, &compute);
  const double wall = SecondsSince(start);
  if (!scores.ok()) return ComputeFailed(scores.status(), 0, start);
  compute = std::min(wall, std::max(0.0, compute));
  metrics_.ObserveStage(Stage::kCompute, compute);
  metrics_.ObserveStage(Stage::kValidate, wall - compute);
  buffered->layers.push_back(*std::move(scores));
  buffered->compute_seconds.push_back(compute);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerDecision>> KvtrimService::DecideModelWide(
    const ResolvedPolicy& policy, ModelWideScores* buffered) {
  if (buffered->layers.empty()) return std::vector<LayerDecision>{};
  const auto start = Clock::now();
  // The backend that scored the layers decides (on the GPU: scores that never left it).
  auto decisions = engine_.DecideModelWide(policy, buffered->layers);
  const double select = SecondsSince(start);
  // The buffered scores (device memory on the GPU backend) are released either way.
  buffered->layers.clear();
  if (!decisions.ok()) {
    buffered->compute_seconds.clear();
    return ComputeFailed(decisions.status(), 0, start);
  }
  metrics_.ObserveStage(Stage::kCompute, select);
  // Each layer reports its own scoring time plus an equal share of the global selection;
  // the backend set the numerics mode that computed its scores.
  const double share = select / static_cast<double>(decisions->size());
  for (size_t i = 0; i < decisions->size(); ++i) {
    (*decisions)[i].compute_seconds = buffered->compute_seconds[i] + share;
  }
  buffered->compute_seconds.clear();
  return decisions;
}

// ---------------------------------------------------------------------------------------
// Compress
// ---------------------------------------------------------------------------------------

grpc::Status KvtrimService::Compress(grpc::ServerContext* context,
                                     const v1::CompressRequest* request,
                                     v1::CompressResponse* response) {
  const auto start = Clock::now();
  const std::string label = PolicyLabel(request->settings().policy().name());
  CallScope scope(*this);
  Admission admission(*this);
  absl::Status status = scope.status().ok() ? admission.status() : scope.status();
  if (status.ok()) status = CompressImpl(context, *request, response);
  if (!status.ok()) response->Clear();
  LogServerError(Rpc::kCompress, request->settings().request_id(), status);
  metrics_.RecordRequest(Rpc::kCompress, label, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

absl::Status KvtrimService::CompressImpl(grpc::ServerContext* context,
                                         const v1::CompressRequest& request,
                                         v1::CompressResponse* response) {
  const auto call_start = Clock::now();
  if (auto st = CheckCallAlive(*context, "decoding the request"); !st.ok()) return st;

  // Decode: settings and every layer's tensor views (no copies), proto-level checks.
  auto stage_start = call_start;
  int64_t bytes = 0;
  for (const auto& layer : request.layers()) bytes += InlineTensorBytes(layer);
  metrics_.AddRequestBytes(Rpc::kCompress, bytes);
  if (!request.has_settings()) {
    return absl::InvalidArgumentError(
        "settings: required (policy and budget); see ListPolicies for the policy names");
  }
  auto settings = DecodeSettings(request.settings(), "settings", default_numerics_);
  if (!settings.ok()) return settings.status();
  if (request.layers_size() == 0) {
    return absl::InvalidArgumentError("layers: empty; send at least one layer");
  }
  std::vector<DecodedLayer> layers(static_cast<size_t>(request.layers_size()));
  std::vector<double> decode_seconds(layers.size(), 0.0);
  std::map<int32_t, int> first_index;  // layer_id -> index of its first occurrence
  int32_t max_layer_id = 0;
  const DecodeContext decode_context = MakeDecodeContext(*context);
  for (int i = 0; i < request.layers_size(); ++i) {
    const std::string field = absl::StrCat("layers[", i, "]");
    const auto decode_start = Clock::now();
    if (auto st = DecodeLayer(request.layers(i), engine_.limits(), field, decode_context,
                              &layers[i]);
        !st.ok()) {
      return st;
    }
    decode_seconds[static_cast<size_t>(i)] = SecondsSince(decode_start);
    CountTransportBytes(layers[i].transport);
    const int32_t id = request.layers(i).layer_id();
    auto [it, inserted] = first_index.emplace(id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".layer_id: duplicate layer_id ", id,
                                                     " (also layers[", it->second, "])"));
    }
    max_layer_id = std::max(max_layer_id, id);
  }
  if (settings->num_layers == 0) settings->num_layers = max_layer_id + 1;
  metrics_.ObserveStage(Stage::kDecode, SecondsSince(stage_start));

  // Validate: resolve the policy once for the request.
  stage_start = Clock::now();
  auto policy = PreparePolicy(*settings, "settings");
  metrics_.ObserveStage(Stage::kValidate, SecondsSince(stage_start));
  if (!policy.ok()) return policy.status();

  // Compute: layer by layer, stopping on deadline or cancellation.
  std::vector<LayerDecision> decisions;
  decisions.reserve(layers.size());
  if (policy->model_wide()) {
    // Score every layer (scores only are kept), then one selection over all of them.
    ModelWideScores buffered;
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string field = absl::StrCat("layers[", i, "]");
      if (auto st = CheckCallAlive(*context, field); !st.ok()) return st;
      if (auto st = ScoreForModelWide(*policy, layers[i].request, field, &buffered); !st.ok()) {
        return st;
      }
    }
    auto decided = DecideModelWide(*policy, &buffered);
    if (!decided.ok()) return decided.status();
    decisions = *std::move(decided);
  } else {
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string field = absl::StrCat("layers[", i, "]");
      if (auto st = CheckCallAlive(*context, field); !st.ok()) return st;
      auto decision = ComputeLayer(*policy, layers[i].request, field);
      if (!decision.ok()) return decision.status();
      decision->profile.decode = decode_seconds[i];
      decisions.push_back(*std::move(decision));
    }
  }

  // Encode (a unary request's server time counts from the handler's start).
  double encode = 0;
  response->set_backend(std::string(engine_.backend_name()));
  for (LayerDecision& decision : decisions) {
    encode += EncodeAnswer(policy->settings, call_start, &decision, response->add_layers());
  }
  metrics_.ObserveStage(Stage::kEncode, encode);
  const std::string label = PolicyLabel(settings->policy);
  for (const LayerDecision& decision : decisions) metrics_.RecordLayer(label, decision);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// CompressSession
// ---------------------------------------------------------------------------------------

grpc::Status KvtrimService::CompressSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream) {
  const auto start = Clock::now();
  std::string label = kNoPolicy;
  std::string request_id;
  CallScope scope(*this);
  Admission admission(*this);
  absl::Status status = scope.status().ok() ? admission.status() : scope.status();
  if (status.ok()) status = SessionImpl(context, stream, &label, &request_id);
  LogServerError(Rpc::kCompressSession, request_id, status);
  metrics_.RecordRequest(Rpc::kCompressSession, label, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

absl::Status KvtrimService::SessionImpl(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::SessionResponse, v1::SessionRequest>* stream,
    std::string* policy_label, std::string* request_id) {
  // The front end runs on the reading thread: protocol order, settings, decoding (regions,
  // chunks) and the engine's validation of layer l + 1 overlap the computation of layer l.
  // Its state belongs to that thread alone.
  struct FrontEndState {
    bool begun = false;
    bool num_layers_known = false;  // begin.num_layers > 0
    int32_t max_layer_id = -1;
    std::set<int32_t> seen;
    std::shared_ptr<const ResolvedPolicy> policy;
  };
  auto state = std::make_shared<FrontEndState>();
  auto fail = [](SessionItem* item, absl::Status status) {
    item->kind = SessionItem::Kind::kError;
    item->status = std::move(status);
  };
  auto front_end = [this, state, fail](SessionItem* item) {
    switch (item->kind) {
      case SessionItem::Kind::kBegin: {
        if (state->begun) {
          return fail(item, absl::FailedPreconditionError(
                                "begin: the session has already begun; send begin exactly once"));
        }
        const auto start = Clock::now();
        auto settings = DecodeSettings(item->request->begin(), "begin", default_numerics_);
        metrics_.ObserveStage(Stage::kDecode, SecondsSince(start));
        if (!settings.ok()) return fail(item, settings.status());
        const auto validate_start = Clock::now();
        auto prepared = PreparePolicy(*settings, "begin");
        metrics_.ObserveStage(Stage::kValidate, SecondsSince(validate_start));
        if (!prepared.ok()) return fail(item, prepared.status());
        state->policy = std::make_shared<const ResolvedPolicy>(*std::move(prepared));
        state->num_layers_known = settings->num_layers > 0;
        state->begun = true;
        item->policy = state->policy;
        return;
      }
      case SessionItem::Kind::kLayer: {
        if (!state->begun) {
          return fail(item, absl::FailedPreconditionError(
                                "layer: received before begin; send begin (the settings) first"));
        }
        metrics_.ObserveStage(Stage::kDecode, item->decode_seconds);
        if (!item->status.ok()) return fail(item, item->status);
        const int32_t id = item->request->layer().layer_id();
        if (!state->seen.insert(id).second) {
          return fail(item, absl::InvalidArgumentError(absl::StrCat(
                                "layer.layer_id: duplicate layer_id ", id, " in this session")));
        }
        // num_layers = 0 means unknown: the layers seen so far define it.
        if (!state->num_layers_known && id > state->max_layer_id) {
          auto updated = std::make_shared<ResolvedPolicy>(*state->policy);
          updated->settings.num_layers = id + 1;
          state->policy = std::move(updated);
        }
        state->max_layer_id = std::max(state->max_layer_id, id);
        item->policy = state->policy;
        const auto start = Clock::now();
        auto validated = engine_.Validate(*item->policy, item->decoded->request, "layer");
        item->validate_seconds = SecondsSince(start);
        if (!validated.ok()) return fail(item, validated.status());
        item->validated = std::make_unique<ValidatedLayer>(*std::move(validated));
        return;
      }
      case SessionItem::Kind::kFinish:
        if (!state->begun) {
          return fail(item, absl::FailedPreconditionError(
                                "finish: received before begin; send begin first"));
        }
        return;
      case SessionItem::Kind::kEmpty:
        return fail(item, absl::InvalidArgumentError(
                              "message: empty SessionRequest; set begin, layer, finish or "
                              "tensor_chunk"));
      default:
        return;
    }
  };
  SessionReader reader(context, stream, engine_.limits(), MakeDecodeContext(*context),
                       transport_options_.max_layer_bytes, transport_options_.session_read_ahead,
                       front_end);
  reader.Start();

  std::shared_ptr<const ResolvedPolicy> policy;
  ModelWideScores buffered;  // model-wide policies: per-layer scores until finish
  v1::SessionSummary summary;
  summary.set_backend(std::string(engine_.backend_name()));
  auto count = [&summary](const LayerDecision& decision) {
    summary.set_layers(summary.layers() + 1);
    for (int32_t kept : decision.kept_per_head) {
      summary.set_tokens_in(summary.tokens_in() + decision.num_tokens);
      summary.set_tokens_kept(summary.tokens_kept() + kept);
    }
  };
  // A failure ends the session with a last `error` message carrying its own code (the call
  // itself may end CANCELLED: the reader's pending Read is cancelled when it stops).
  const absl::Status status = [&]() -> absl::Status {
    while (true) {
      SessionItem item = reader.Next();
      switch (item.kind) {
        case SessionItem::Kind::kBegin:
          *policy_label = PolicyLabel(item.request->begin().policy().name());
          *request_id = item.request->begin().request_id();
          policy = item.policy;
          break;
        case SessionItem::Kind::kLayer: {
          metrics_.AddRequestBytes(Rpc::kCompressSession, item.wire_bytes);
          CountTransportBytes(item.decoded->transport);
          if (auto st = CheckCallAlive(*context, "layer"); !st.ok()) return st;
          policy = item.policy;  // num_layers grows with the layers seen when begin left it 0
          const ResolvedPolicy& layer_policy = *item.policy;
          const ValidatedLayer& layer = *item.validated;
          const auto start = Clock::now();
          if (layer_policy.model_wide()) {
            // Answered at finish: keep this layer's scores only (never K/V).
            double compute = 0;
            auto scores = engine_.ScoreValidated(layer_policy, layer, "layer", &compute);
            if (!scores.ok()) return ComputeFailed(scores.status(), item.validate_seconds, start);
            metrics_.ObserveStage(Stage::kValidate, item.validate_seconds);
            metrics_.ObserveStage(Stage::kCompute, compute);
            buffered.layers.push_back(*std::move(scores));
            buffered.compute_seconds.push_back(compute);
            break;
          }
          auto decision = engine_.CompressValidated(layer_policy, layer, "layer");
          if (!decision.ok()) return ComputeFailed(decision.status(), item.validate_seconds, start);
          metrics_.ObserveStage(Stage::kValidate, item.validate_seconds);
          metrics_.ObserveStage(Stage::kCompute, decision->compute_seconds);
          item.decoded.reset();  // releases the layer's region pins and buffers
          decision->profile.decode = item.decode_seconds;
          decision->profile.validate = item.validate_seconds;
          decision->profile.queued =
              std::max(0.0, std::chrono::duration<double>(start - item.ready).count());
          v1::SessionResponse response;
          metrics_.ObserveStage(Stage::kEncode,
                                EncodeAnswer(layer_policy.settings, item.received, &*decision,
                                             response.mutable_layer()));
          if (!stream->Write(response)) {
            return absl::CancelledError("layer: the client went away before the answer was sent");
          }
          metrics_.RecordLayer(*policy_label, *decision);
          count(*decision);
          break;
        }
        case SessionItem::Kind::kFinish: {
          if (policy != nullptr && policy->model_wide()) {
            auto decided = DecideModelWide(*policy, &buffered);
            if (!decided.ok()) return decided.status();
            for (const LayerDecision& decision : *decided) {
              v1::SessionResponse layer_response;
              EncodeLayerResult(decision, layer_response.mutable_layer(),
                                policy->settings.packed_answer);
              if (!stream->Write(layer_response)) {
                return absl::CancelledError(
                    "finish: the client went away before the layer answers were sent");
              }
              metrics_.RecordLayer(*policy_label, decision);
              count(decision);
            }
          }
          v1::SessionResponse response;
          *response.mutable_finished() = summary;
          if (!stream->Write(response)) {
            return absl::CancelledError("finish: the client went away before the summary was sent");
          }
          return absl::OkStatus();
        }
        case SessionItem::Kind::kError:
          metrics_.AddRequestBytes(Rpc::kCompressSession, item.wire_bytes);  // bad ones count too
          if (item.request != nullptr && item.request->has_begin()) {
            *policy_label = PolicyLabel(item.request->begin().policy().name());
            *request_id = item.request->begin().request_id();
          }
          return item.status;
        case SessionItem::Kind::kEnd:
        default:
          if (auto st = CheckCallAlive(*context, "the end of the stream"); !st.ok()) return st;
          return absl::InvalidArgumentError(
              "finish: the client closed the stream without sending finish; layers already "
              "answered stand, the session is abandoned");
      }
    }
  }();
  if (!status.ok()) {
    const grpc::Status wire = ToGrpcStatus(status);
    v1::SessionResponse failure;
    failure.mutable_error()->set_code(static_cast<int32_t>(wire.error_code()));
    failure.mutable_error()->set_message(wire.error_message());
    stream->Write(failure);  // best effort: the client may be gone
  }
  return status;
}

absl::Status KvtrimService::ComputeFailed(const absl::Status& status, double validate_seconds,
                                          Clock::time_point start) {
  metrics_.ObserveStage(Stage::kValidate, validate_seconds + SecondsSince(start));
  if (status.code() == absl::StatusCode::kInternal && backend_failure_hook_) {
    backend_failure_hook_(status);
  }
  return status;
}

// ---------------------------------------------------------------------------------------
// Regions
// ---------------------------------------------------------------------------------------

DecodeContext KvtrimService::MakeDecodeContext(const grpc::ServerContext& context) const {
  DecodeContext decode;
  decode.regions = regions_;
  decode.buffers = buffers_;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientIdMetadata);
  if (it != metadata.end()) decode.client_id.assign(it->second.data(), it->second.size());
  return decode;
}

void KvtrimService::CountTransportBytes(const TransportBytes& bytes) {
  metrics_.AddTransportBytes(Transport::kInline, bytes.inline_bytes);
  metrics_.AddTransportBytes(Transport::kHostShm, bytes.host_shm);
  metrics_.AddTransportBytes(Transport::kCudaIpc, bytes.cuda_ipc);
}

void KvtrimService::PublishRegionMetrics() {
  if (regions_ == nullptr) return;
  const auto counts = regions_->CountByKind();
  metrics_.SetRegions(counts.at(RegionKind::kHostShm), counts.at(RegionKind::kCudaIpc),
                      counts.at(RegionKind::kCudaIpcEvent), regions_->clients());
}

grpc::Status KvtrimService::Regions(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::RegionResponse, v1::RegionRequest>* stream) {
  const auto start = Clock::now();
  absl::Status status = regions_ == nullptr
                            ? absl::FailedPreconditionError(
                                  "regions: this kvtrimd serves no regions; send inline_data")
                            : regions_->CheckEnabled();
  {
    std::lock_guard<std::mutex> lock(calls_mutex_);
    if (draining_) {
      status = absl::UnavailableError(
          "draining: kvtrimd is shutting down and accepts no new calls; retry on another replica");
    }
  }
  if (status.ok()) status = RegionsImpl(stream);
  metrics_.RecordRequest(Rpc::kRegions, kNoPolicy, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

absl::Status KvtrimService::RegionsImpl(
    grpc::ServerReaderWriter<v1::RegionResponse, v1::RegionRequest>* stream) {
  const std::string client_id = regions_->OpenClient();
  PublishRegionMetrics();
  // Every region of the lease goes when the stream ends, however it ends.
  struct Lease {
    KvtrimService* service;
    std::string client_id;
    ~Lease() {
      service->regions_->CloseClient(client_id);
      service->PublishRegionMetrics();
    }
  } lease{this, client_id};
  v1::RegionResponse first;
  first.mutable_lease()->set_client_id(client_id);
  first.mutable_lease()->set_max_regions(regions_->options().max_regions_per_client);
  if (!stream->Write(first)) return absl::CancelledError("regions: the client went away");
  v1::RegionRequest request;
  while (true) {
    request.Clear();
    if (!stream->Read(&request)) {
      // Client half-close ends the lease normally; cancellation / deadline too.
      return absl::OkStatus();
    }
    v1::RegionResponse response;
    response.set_tag(request.tag());
    absl::Status result;
    switch (request.message_case()) {
      case v1::RegionRequest::kRegisterRegion: {
        auto id = regions_->Register(client_id, request.register_region());
        if (id.ok()) {
          response.set_registered_region_id(*id);
        } else {
          result = id.status();
        }
        break;
      }
      case v1::RegionRequest::kUnregisterRegion:
        result = regions_->Unregister(client_id, request.unregister_region().region_id());
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
    PublishRegionMetrics();
    if (!stream->Write(response)) return absl::OkStatus();
  }
}

// ---------------------------------------------------------------------------------------
// Model registration
// ---------------------------------------------------------------------------------------

grpc::Status KvtrimService::RegisterModel(grpc::ServerContext* context,
                                          grpc::ServerReader<v1::RegisterModelRequest>* reader,
                                          v1::RegisterModelResponse* response) {
  const auto start = Clock::now();
  CallScope scope(*this);
  absl::Status status = scope.status();
  int64_t bytes = 0;
  if (status.ok()) status = RegisterModelImpl(context, reader, response, &bytes);
  if (!status.ok()) response->Clear();
  metrics_.AddRequestBytes(Rpc::kRegisterModel, bytes);
  LogServerError(Rpc::kRegisterModel, "", status);
  metrics_.RecordRequest(Rpc::kRegisterModel, kNoPolicy, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

absl::Status KvtrimService::RegisterModelImpl(grpc::ServerContext* context,
                                              grpc::ServerReader<v1::RegisterModelRequest>* reader,
                                              v1::RegisterModelResponse* response,
                                              int64_t* bytes) {
  ModelAssembler assembler(models_.options().max_model_bytes);
  v1::RegisterModelRequest message;
  for (int64_t index = 0;; ++index) {
    message.Clear();
    if (!reader->Read(&message)) break;
    if (auto st = CheckCallAlive(*context, absl::StrCat("RegisterModel message #", index + 1));
        !st.ok()) {
      return st;
    }
    absl::Status added = assembler.Add(message);
    *bytes = assembler.received_bytes();
    if (!added.ok()) return added;
  }
  // The stream also ends when the client cancels or the deadline passes.
  if (auto st = CheckCallAlive(*context, "storing the model"); !st.ok()) return st;
  auto input = assembler.Finish();
  if (!input.ok()) return input.status();
  auto digest = models_.Add(*std::move(input));
  if (!digest.ok()) return digest.status();
  response->set_digest(*digest);
  return absl::OkStatus();
}

grpc::Status KvtrimService::ListModels(grpc::ServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) {
  const auto start = Clock::now();
  CallScope scope(*this);
  const absl::Status status = scope.status();
  if (status.ok()) {
    for (const auto& model : models_.List()) EncodeModelInfo(*model, response->add_models());
  }
  metrics_.RecordRequest(Rpc::kListModels, kNoPolicy, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

grpc::Status KvtrimService::DeleteModel(grpc::ServerContext* context,
                                        const v1::DeleteModelRequest* request,
                                        v1::DeleteModelResponse* response) {
  const auto start = Clock::now();
  CallScope scope(*this);
  absl::Status status = scope.status();
  if (status.ok()) status = models_.Delete(request->digest());
  LogServerError(Rpc::kDeleteModel, "", status);
  metrics_.RecordRequest(Rpc::kDeleteModel, kNoPolicy, status.code(), SecondsSince(start));
  return ToGrpcStatus(status);
}

}  // namespace kvtrim::service
