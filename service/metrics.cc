#include "service/metrics.h"

#include <cmath>
#include <iterator>

#include "service/status.h"
#include "version/build_version.h"

namespace kvtrim::service {

namespace {

constexpr Rpc kAllRpcs[] = {Rpc::kListPolicies,  Rpc::kCompress,   Rpc::kCompressSession,
                            Rpc::kRegisterModel, Rpc::kListModels, Rpc::kDeleteModel,
                            Rpc::kRegions, Rpc::kListRegions};
static_assert(std::size(kAllRpcs) == kRpcCount, "kAllRpcs must list every Rpc");
constexpr Stage kAllStages[] = {Stage::kDecode, Stage::kValidate, Stage::kCompute,
                                Stage::kEncode, Stage::kAdmission, Stage::kQueue};
static_assert(std::size(kAllStages) == kStageCount, "kAllStages must list every Stage");

/// Index of `mode` in PolicySeries::layers (0 fast, 1 exact).
size_t NumericsIndex(Numerics mode) { return mode == Numerics::kFast ? 0 : 1; }

/// Call latency buckets, seconds: 0.5 ms .. 60 s.
const prometheus::Histogram::BucketBoundaries& RequestBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *b;
}
/// Stage latency buckets, seconds: 50 us .. 10 s.
const prometheus::Histogram::BucketBoundaries& StageBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,    5,   10};
  return *b;
}
/// Kept fraction buckets: 0.01 .. 1.
const prometheus::Histogram::BucketBoundaries& KeptRatioBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1};
  return *b;
}
/// Relative output perturbation buckets: 0.001 .. 2.
const prometheus::Histogram::BucketBoundaries& PerturbationBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2};
  return *b;
}

}  // namespace

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kListPolicies: return "ListPolicies";
    case Rpc::kCompress: return "Compress";
    case Rpc::kCompressSession: return "CompressSession";
    case Rpc::kRegisterModel: return "RegisterModel";
    case Rpc::kListModels: return "ListModels";
    case Rpc::kDeleteModel: return "DeleteModel";
    case Rpc::kRegions: return "Regions";
    case Rpc::kListRegions: return "ListRegions";
  }
  return "unknown";
}

const char* TransportName(Transport transport) {
  switch (transport) {
    case Transport::kInline: return "inline";
    case Transport::kHostShm: return "host_shm";
    case Transport::kCudaIpc: return "cuda_ipc";
  }
  return "unknown";
}

const char* StageName(Stage stage) {
  switch (stage) {
    case Stage::kDecode: return "decode";
    case Stage::kValidate: return "validate";
    case Stage::kCompute: return "compute";
    case Stage::kEncode: return "encode";
    case Stage::kAdmission: return "admission";
    case Stage::kQueue: return "queue";
  }
  return "unknown";
}

Metrics::Metrics(const std::string& version, const std::string& backend,
                 const std::vector<std::string>& presets)
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("kvtrim_requests_total")
                    .Help("Finished calls by rpc, policy and gRPC status code name")
                    .Register(*registry_)),
      request_duration_(prometheus::BuildHistogram()
                            .Name("kvtrim_request_duration_seconds")
                            .Help("Wall time of a call from handler entry to its status, seconds")
                            .Register(*registry_)),
      stage_duration_(prometheus::BuildHistogram()
                          .Name("kvtrim_stage_duration_seconds")
                          .Help("Time spent per stage (decode|validate|compute|encode|"
                                "admission), seconds")
                          .Register(*registry_)),
      layers_(prometheus::BuildCounter()
                  .Name("kvtrim_layers_total")
                  .Help("Layers answered, by policy and by the numerics mode that computed "
                        "them (fast|exact)")
                  .Register(*registry_)),
      tokens_in_(prometheus::BuildCounter()
                     .Name("kvtrim_tokens_in_total")
                     .Help("Cached tokens scored: sum over layers and KV heads of n")
                     .Register(*registry_)),
      tokens_kept_(prometheus::BuildCounter()
                       .Name("kvtrim_tokens_kept_total")
                       .Help("Tokens kept: sum over layers and KV heads of kept")
                       .Register(*registry_)),
      kept_ratio_(prometheus::BuildHistogram()
                      .Name("kvtrim_kept_ratio")
                      .Help("Kept fraction kept/n, one observation per KV head")
                      .Register(*registry_)),
      perturbation_(prometheus::BuildHistogram()
                        .Name("kvtrim_perturbation_ratio")
                        .Help("Relative output perturbation ||a_kept - a_full|| / ||a_full||, "
                              "one observation per KV head when computed; rows=\"all\" over "
                              "every window row, \"sampled\" over the last few of each query "
                              "head (settings.perturbation SAMPLED, fast numerics)")
                        .Register(*registry_)),
      request_bytes_(prometheus::BuildCounter()
                         .Name("kvtrim_request_bytes_total")
                         .Help("Bytes of tensor data received, by rpc")
                         .Register(*registry_)),
      inflight_family_(prometheus::BuildGauge()
                           .Name("kvtrim_inflight_requests")
                           .Help("Compress and CompressSession calls admitted and not finished")
                           .Register(*registry_)),
      build_info_(prometheus::BuildGauge()
                      .Name("kvtrim_build_info")
                      .Help("Always 1; labels carry the kvtrimd version and the backend")
                      .Register(*registry_)),
      transport_bytes_(prometheus::BuildCounter()
                           .Name("kvtrim_tensor_bytes_total")
                           .Help("Bytes of layer tensors read, by transport (inline bytes and "
                                 "chunks, host shared memory, CUDA IPC in place)")
                           .Register(*registry_)),
      regions_(prometheus::BuildGauge()
                   .Name("kvtrim_regions")
                   .Help("Regions registered by clients now, by kind")
                   .Register(*registry_)),
      leases_family_(prometheus::BuildGauge()
                         .Name("kvtrim_region_leases")
                         .Help("Open Regions streams (client leases)")
                         .Register(*registry_)),
      pinned_family_(prometheus::BuildGauge()
                         .Name("kvtrim_pinned_shm_bytes")
                         .Help("Bytes of host shm segments page-locked for direct device "
                               "copies now (--max_pinned_shm_bytes)")
                         .Register(*registry_)),
      pinned_buffer_family_(prometheus::BuildGauge()
                                .Name("kvtrim_pinned_buffer_bytes")
                                .Help("Bytes of kvtrimd's pooled host buffers (chunked tensors "
                                      "arrive in them) page-locked for direct device copies "
                                      "now (--max_pinned_buffer_bytes)")
                                .Register(*registry_)),
      heap_family_(prometheus::BuildGauge()
                       .Name("kvtrim_heap_bytes")
                       .Help("kvtrimd's malloc heap, read every 10 s after the trim: bytes "
                             "allocated in the arenas (in_use), kept free in them (free), "
                             "mapped for allocations of 256 KiB and more (mmapped)")
                       .Register(*registry_)),
      host_buffer_family_(prometheus::BuildGauge()
                              .Name("kvtrim_host_buffer_bytes")
                              .Help("Bytes of kvtrimd's pooled host buffers (chunked tensors "
                                    "arrive in them): idle in the pool, or in use by calls")
                              .Register(*registry_)),
      device_layers_(prometheus::BuildCounter()
                         .Name("kvtrim_device_layers_total")
                         .Help("Layers answered, by the device that computed them (a CUDA "
                               "ordinal, or \"cpu\")")
                         .Register(*registry_)),
      model_layers_(prometheus::BuildCounter()
                        .Name("kvtrim_model_layers_total")
                        .Help("Layers answered with a registered model (settings.model_digest), "
                              "by model: its digest's first 12 hex digits")
                        .Register(*registry_)) {
  for (Transport t : {Transport::kInline, Transport::kHostShm, Transport::kCudaIpc}) {
    transport_[static_cast<size_t>(t)] = &transport_bytes_.Add({{"transport", TransportName(t)}});
  }
  const char* kinds[] = {"host_shm", "cuda_ipc", "cuda_ipc_event"};
  for (size_t i = 0; i < 3; ++i) region_kinds_[i] = &regions_.Add({{"kind", kinds[i]}});
  leases_ = &leases_family_.Add({});
  pinned_shm_bytes_ = &pinned_family_.Add({});
  pinned_buffer_bytes_ = &pinned_buffer_family_.Add({});
  const char* heap_states[] = {"in_use", "free", "mmapped"};
  for (size_t i = 0; i < 3; ++i) heap_bytes_[i] = &heap_family_.Add({{"state", heap_states[i]}});
  host_buffer_bytes_[0] = &host_buffer_family_.Add({{"state", "idle"}});
  host_buffer_bytes_[1] = &host_buffer_family_.Add({{"state", "in_use"}});
  for (Rpc rpc : kAllRpcs) {
    const auto i = static_cast<size_t>(rpc);
    rpc_duration_[i] = &request_duration_.Add({{"rpc", RpcName(rpc)}}, RequestBuckets());
    rpc_bytes_[i] = &request_bytes_.Add({{"rpc", RpcName(rpc)}});
  }
  for (Stage stage : kAllStages) {
    stage_[static_cast<size_t>(stage)] =
        &stage_duration_.Add({{"stage", StageName(stage)}}, StageBuckets());
  }
  inflight_ = &inflight_family_.Add({});
  build_info_.Add({{"version", version}, {"git_commit", GitCommit()}, {"backend", backend}})
      .Set(1);
  for (const auto& preset : presets) SeriesFor(preset);
}

void Metrics::RecordRequest(Rpc rpc, const std::string& policy, absl::StatusCode code,
                            double seconds) {
  requests_.Add({{"rpc", RpcName(rpc)}, {"policy", policy}, {"code", StatusCodeName(code)}})
      .Increment();
  rpc_duration_[static_cast<size_t>(rpc)]->Observe(seconds);
}

void Metrics::ObserveStage(Stage stage, double seconds) {
  stage_[static_cast<size_t>(stage)]->Observe(seconds);
}

Metrics::PolicySeries& Metrics::SeriesFor(const std::string& policy) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = series_.find(policy);
  if (it != series_.end()) return it->second;
  const prometheus::Labels labels{{"policy", policy}};
  PolicySeries s;
  for (Numerics mode : {Numerics::kFast, Numerics::kExact}) {
    s.layers[NumericsIndex(mode)] =
        &layers_.Add({{"policy", policy}, {"numerics", NumericsName(mode)}});
  }
  s.tokens_in = &tokens_in_.Add(labels);
  s.tokens_kept = &tokens_kept_.Add(labels);
  s.kept_ratio = &kept_ratio_.Add(labels, KeptRatioBuckets());
  for (int sampled = 0; sampled < 2; ++sampled) {
    s.perturbation[sampled] = &perturbation_.Add(
        {{"policy", policy}, {"rows", sampled != 0 ? "sampled" : "all"}}, PerturbationBuckets());
  }
  return series_.emplace(policy, s).first->second;
}

void Metrics::SetModelLabelLimit(size_t models) {
  std::lock_guard<std::mutex> lock(mutex_);
  model_label_limit_ = models;
}

std::string ModelLabel(const std::string& digest) {
  constexpr size_t kShown = sizeof("sha256:") - 1 + 12;
  return digest.substr(0, kShown);
}

prometheus::Counter& Metrics::ModelCounter(const std::string& digest) {
  const std::string label = ModelLabel(digest);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = model_series_.find(label);
  if (it != model_series_.end()) return *it->second;
  // Past the limit every new model shares "other": the label stays bounded however many
  // models are registered and deleted over the process's life.
  const std::string value = model_series_.size() < model_label_limit_ ? label : "other";
  if (auto other = model_series_.find(value); other != model_series_.end()) {
    return *other->second;
  }
  prometheus::Counter& counter = model_layers_.Add({{"model", value}});
  model_series_.emplace(value, &counter);
  return counter;
}

void Metrics::RecordLayer(const std::string& policy, const LayerDecision& decision,
                          const std::string& model_digest) {
  if (!model_digest.empty()) ModelCounter(model_digest).Increment();
  PolicySeries& s = SeriesFor(policy);
  const auto heads = static_cast<int64_t>(decision.kept_per_head.size());
  int64_t kept = 0;
  for (int32_t k : decision.kept_per_head) {
    kept += k;
    if (decision.num_tokens > 0) {
      s.kept_ratio->Observe(static_cast<double>(k) / static_cast<double>(decision.num_tokens));
    }
  }
  if (decision.perturbation.size() == decision.kept_per_head.size()) {
    prometheus::Histogram* h = s.perturbation[decision.perturbation_sampled ? 1 : 0];
    // A NaN would make the histogram's sum NaN for good (a statistic that overflowed fp32
    // on a device tensor the host cannot re-read): never observed.
    for (double p : decision.perturbation) {
      if (std::isfinite(p)) h->Observe(p);
    }
  }
  s.layers[NumericsIndex(decision.numerics)]->Increment();
  s.tokens_in->Increment(static_cast<double>(heads * decision.num_tokens));
  s.tokens_kept->Increment(static_cast<double>(kept));
  DeviceCounter(decision.device).Increment();
}

prometheus::Counter& Metrics::DeviceCounter(int32_t device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = device_series_.find(device);
  if (it != device_series_.end()) return *it->second;
  const std::string label = device < 0 ? std::string("cpu") : std::to_string(device);
  prometheus::Counter& counter = device_layers_.Add({{"device", label}});
  device_series_.emplace(device, &counter);
  return counter;
}

void Metrics::AddRequestBytes(Rpc rpc, int64_t bytes) {
  if (bytes > 0) rpc_bytes_[static_cast<size_t>(rpc)]->Increment(static_cast<double>(bytes));
}

void Metrics::InflightChanged(int delta) { inflight_->Increment(delta); }

void Metrics::AddTransportBytes(Transport transport, int64_t bytes) {
  if (bytes > 0) transport_[static_cast<size_t>(transport)]->Increment(static_cast<double>(bytes));
}

void Metrics::SetPinnedBufferBytes(uint64_t bytes) {
  pinned_buffer_bytes_->Set(static_cast<double>(bytes));
}

void Metrics::SetHeapBytes(uint64_t in_use, uint64_t free, uint64_t mmapped) {
  heap_bytes_[0]->Set(static_cast<double>(in_use));
  heap_bytes_[1]->Set(static_cast<double>(free));
  heap_bytes_[2]->Set(static_cast<double>(mmapped));
}

void Metrics::SetHostBufferBytes(uint64_t idle, uint64_t in_use) {
  host_buffer_bytes_[0]->Set(static_cast<double>(idle));
  host_buffer_bytes_[1]->Set(static_cast<double>(in_use));
}

void Metrics::SetRegions(int64_t host_shm, int64_t cuda_ipc, int64_t cuda_ipc_event,
                         int64_t leases, uint64_t pinned_shm_bytes) {
  pinned_shm_bytes_->Set(static_cast<double>(pinned_shm_bytes));
  region_kinds_[0]->Set(static_cast<double>(host_shm));
  region_kinds_[1]->Set(static_cast<double>(cuda_ipc));
  region_kinds_[2]->Set(static_cast<double>(cuda_ipc_event));
  leases_->Set(static_cast<double>(leases));
}

}  // namespace kvtrim::service
