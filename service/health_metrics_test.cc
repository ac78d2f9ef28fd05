// Health (grpc.health.v1), Prometheus metrics and drain behaviour of a running server.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <limits>
#include <optional>
#include <thread>

#include "kernels/cpu/cpu_backend.h"
#include "service/gpu_metrics.h"
#include "service/limit_metrics.h"
#include "service/process_metrics.h"
#include "service/test_util.h"
#include "version/build_version.h"
#include "tests/testing/test_dir.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;

TEST(HealthTest, ServingAfterWarmUp) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto channel = Connect(*server);
  grpc::Status status;
  EXPECT_EQ(HealthCheck(channel, "", &status), 1) << status.error_message();  // SERVING
  EXPECT_EQ(HealthCheck(channel, "kvtrim.v1.Kvtrim", &status), 1) << status.error_message();
  EXPECT_EQ(HealthCheck(channel, "no.such.Service", &status), -1);
  EXPECT_EQ(status.error_code(), StatusCode::NOT_FOUND);
}

TEST(HealthTest, ReflectionIsEnabled) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  // ServerReflectionInfo is a bidi stream; opening it and closing without messages ends
  // OK when the reflection service is registered (UNIMPLEMENTED otherwise).
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::GenericStub generic(Connect(*server));
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&context,
                                  "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                  &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  call->WritesDone(reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(DrainTest, DrainWaitsForInflightSessionAndRefusesNewCalls) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  grpc::ClientContext context;
  auto stream = stub->CompressSession(&context);
  v1::SessionRequest begin;
  *begin.mutable_begin() = MakeSettings("knorm");
  ASSERT_TRUE(stream->Write(begin));
  for (int i = 0; i < 500 && server->service().inflight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(server->service().inflight(), 1);

  auto drained = std::async(std::launch::async, [&] { server->Drain(); });
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  // While draining, new calls are refused with UNAVAILABLE so that clients go elsewhere.
  EXPECT_GRPC_ERROR(CallCompress(*stub, MakeRequest("knorm")), StatusCode::UNAVAILABLE,
                    "draining");
  EXPECT_NE(HealthCheck(Connect(*server), ""), 1);
  // The in-flight session still completes normally.
  v1::SessionRequest layer;
  *layer.mutable_layer() = MakeLayer(0);
  ASSERT_TRUE(stream->Write(layer));
  v1::SessionRequest finish;
  finish.mutable_finish();
  ASSERT_TRUE(stream->Write(finish));
  stream->WritesDone();
  v1::SessionResponse response;
  int answers = 0;
  while (stream->Read(&response)) ++answers;
  const grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << finished.error_code() << ": " << finished.error_message();
  EXPECT_EQ(answers, 2);
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // New calls are refused once drained.
  grpc::ClientContext late;
  late.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::CompressResponse unused;
  EXPECT_FALSE(stub->Compress(&late, MakeRequest("knorm"), &unused).ok());
}

TEST(DrainTest, DrainTimeoutCancelsStuckCalls) {
  Config config = TestConfig();
  config.drain_timeout_s = 1;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  grpc::ClientContext context;
  auto stream = stub->CompressSession(&context);
  v1::SessionRequest begin;
  *begin.mutable_begin() = MakeSettings("knorm");
  ASSERT_TRUE(stream->Write(begin));
  for (int i = 0; i < 500 && server->service().inflight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto start = std::chrono::steady_clock::now();
  server->Drain();  // the session never finishes: cancelled after 1 s
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  v1::SessionResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_FALSE(stream->Finish().ok());
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer(TestConfig());
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Kvtrim::NewStub(Connect(*server_));
  }
  double Counter(const std::string& name,
                 const std::vector<std::pair<std::string, std::string>>& labels) {
    return CounterValue(*server_, name, labels);
  }
  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Kvtrim::Stub> stub_;
};

TEST_F(MetricsTest, CountersMoveWithRequests) {
  const auto families = server_->metrics().registry()->Collect();
  const auto* info = FindMetric(families, "kvtrim_build_info",
                                {{"backend", "cpu"}, {"git_commit", GitCommit()}});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->gauge.value, 1);
  // Preset series exist at zero before any request.
  for (const char* numerics : {"fast", "exact"}) {
    ASSERT_NE(FindMetric(families, "kvtrim_layers_total",
                         {{"policy", "dropkv"}, {"numerics", numerics}}),
              nullptr)
        << numerics;
  }

  ASSERT_TRUE(CallCompress(*stub_, MakeRequest("snapkv", 3)).ok());
  EXPECT_EQ(Counter("kvtrim_requests_total",
                    {{"rpc", "Compress"}, {"policy", "snapkv"}, {"code", "OK"}}), 1);
  // The request left numerics unspecified (server default fast); the CPU has a fast path
  // for snapkv (kernels/cpu/fast/).
  EXPECT_EQ(Counter("kvtrim_layers_total", {{"policy", "snapkv"}, {"numerics", "fast"}}), 3);
  EXPECT_EQ(Counter("kvtrim_layers_total", {{"policy", "snapkv"}, {"numerics", "exact"}}), 0);
  EXPECT_EQ(Counter("kvtrim_tokens_in_total", {{"policy", "snapkv"}}), 3 * 2 * 64);
  EXPECT_EQ(Counter("kvtrim_tokens_kept_total", {{"policy", "snapkv"}}), 3 * 2 * 32);
  EXPECT_EQ(Counter("kvtrim_device_layers_total", {{"device", "cpu"}}), 3);
  EXPECT_EQ(HistogramCount(*server_, "kvtrim_kept_ratio", {{"policy", "snapkv"}}), 3u * 2);
  EXPECT_EQ(HistogramCount(*server_, "kvtrim_perturbation_ratio",
                           {{"policy", "snapkv"}, {"rows", "all"}}),
            3u * 2);
  // keys + values [2, 64, 8] f32 and queries [4, 32, 8] f32 per layer.
  EXPECT_EQ(Counter("kvtrim_request_bytes_total", {{"rpc", "Compress"}}),
            3 * (2 * 2 * 64 * 8 * 4 + 4 * 32 * 8 * 4));
  EXPECT_EQ(HistogramCount(*server_, "kvtrim_request_duration_seconds", {{"rpc", "Compress"}}),
            1u);
  for (const char* stage : {"decode", "validate", "compute", "encode"}) {
    EXPECT_GT(HistogramCount(*server_, "kvtrim_stage_duration_seconds", {{"stage", stage}}), 0u)
        << stage;
  }

  // Errors: a resolvable policy keeps its name, an unknown one is "invalid".
  auto bad = MakeRequest("snapkv");
  bad.mutable_layers(0)->mutable_keys()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(CallCompress(*stub_, bad).ok());
  EXPECT_FALSE(CallCompress(*stub_, MakeRequest("made_up")).ok());
  EXPECT_EQ(Counter("kvtrim_requests_total",
                    {{"rpc", "Compress"}, {"policy", "snapkv"}, {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(Counter("kvtrim_requests_total",
                    {{"rpc", "Compress"}, {"policy", "invalid"}, {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(Counter("kvtrim_layers_total", {{"policy", "snapkv"}, {"numerics", "fast"}}),
            3);  // unchanged

  // Sessions count per layer as answered.
  grpc::ClientContext context;
  auto stream = stub_->CompressSession(&context);
  v1::SessionRequest m;
  *m.mutable_begin() = MakeSettings("knorm");
  stream->Write(m);
  *m.mutable_layer() = MakeLayer(0);
  stream->Write(m);
  m.mutable_finish();
  stream->Write(m);
  stream->WritesDone();
  v1::SessionResponse response;
  while (stream->Read(&response)) {
  }
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Counter("kvtrim_requests_total",
                    {{"rpc", "CompressSession"}, {"policy", "knorm"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Counter("kvtrim_layers_total", {{"policy", "knorm"}, {"numerics", "fast"}}), 1);
  EXPECT_EQ(Counter("kvtrim_tokens_kept_total", {{"policy", "knorm"}}), 2 * 32);
  EXPECT_EQ(HistogramCount(*server_, "kvtrim_perturbation_ratio",
                           {{"policy", "knorm"}, {"rows", "all"}}),
            2u);

  grpc::ClientContext list_context;
  v1::ListPoliciesResponse list;
  ASSERT_TRUE(stub_->ListPolicies(&list_context, v1::ListPoliciesRequest(), &list).ok());
  EXPECT_EQ(Counter("kvtrim_requests_total",
                    {{"rpc", "ListPolicies"}, {"policy", "none"}, {"code", "OK"}}), 1);
  // A call's in-flight slot is released when its reactor is destroyed, after OnDone, which
  // gRPC runs once the status has been sent: the client may read its status first.
  double inflight_now = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    const auto after = server_->metrics().registry()->Collect();
    const auto* inflight = FindMetric(after, "kvtrim_inflight_requests", {});
    ASSERT_NE(inflight, nullptr);
    inflight_now = inflight->gauge.value;
    if (inflight_now == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(inflight_now, 0);
}

/// GET /metrics over HTTP from the exporter on an ephemeral port.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) < 0) {
    close(fd);
    return "";
  }
  std::string body;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) body.append(buffer, static_cast<size_t>(n));
  close(fd);
  return body;
}

// kvtrim_model_layers_total: one series per model up to the limit (--max_models), then
// every further model under "other"; layers without a model are not counted.
TEST(ModelMetricsTest, TheModelLabelIsBoundedByTheLimit) {
  Metrics metrics("0.0.0", "cpu", {});
  metrics.SetModelLabelLimit(2);
  LayerDecision decision;
  decision.kept_per_head = {1, 1};
  decision.num_tokens = 4;
  const std::string a = "sha256:" + std::string(64, 'a');
  const std::string b = "sha256:" + std::string(64, 'b');
  for (const std::string& digest : {a, b, a, std::string(), "sha256:" + std::string(64, 'c'),
                                    "sha256:" + std::string(64, 'd')}) {
    metrics.RecordLayer("knorm", decision, digest);
  }
  const auto families = metrics.registry()->Collect();
  const auto value = [&families](const std::string& model) {
    const auto* m = FindMetric(families, "kvtrim_model_layers_total", {{"model", model}});
    return m == nullptr ? -1.0 : m->counter.value;
  };
  EXPECT_EQ(value("sha256:aaaaaaaaaaaa"), 2);
  EXPECT_EQ(value("sha256:bbbbbbbbbbbb"), 1);
  EXPECT_EQ(value("other"), 2);
  EXPECT_EQ(value("sha256:cccccccccccc"), -1);
}

TEST_F(MetricsTest, HeapFiguresArePublished) {
  server_->PublishMemoryMetrics();
  const auto families = server_->metrics().registry()->Collect();
  for (const char* state : {"in_use", "free", "mmapped"}) {
    const auto* heap = FindMetric(families, "kvtrim_heap_bytes", {{"state", state}});
    ASSERT_NE(heap, nullptr) << state;
    EXPECT_GE(heap->gauge.value, 0) << state;
  }
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // glibc's figures (a sanitizer's allocator replaces glibc malloc).
  EXPECT_GT(FindMetric(families, "kvtrim_heap_bytes", {{"state", "in_use"}})->gauge.value, 0);
#endif
  // kvtrim_host_buffer_bytes is tested where a chunked session fills the pool
  // (TransportTest.ChunkedTensorsOfAMiBOrMoreGoThroughTheHostBufferPool).
}

TEST(LimitMetricsTest, EveryLimitIsPublishedWithTheConfiguredValue) {
  Config config = TestConfig();
  config.max_inflight = 7;
  config.max_leases = 9;
  config.admission_wait_ms = 250;
  config.gpu_memory_limit_bytes = 0;  // no cap
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  const auto families = server->metrics().registry()->Collect();
  const auto value = [&families](const std::string& name) {
    const auto* metric = FindMetric(families, name, {});
    return metric == nullptr ? -1.0 : metric->gauge.value;
  };
  EXPECT_EQ(value("kvtrim_limit_inflight_requests"), 7);
  EXPECT_EQ(value("kvtrim_limit_region_leases"), 9);
  EXPECT_DOUBLE_EQ(value("kvtrim_limit_admission_wait_seconds"), 0.25);
  EXPECT_EQ(value("kvtrim_limit_message_bytes"), double(int64_t{16} << 20));
  EXPECT_EQ(value("kvtrim_limit_regions_per_client"), 0);  // no --allow_client_shm
  EXPECT_EQ(value("kvtrim_limit_gpu_memory_bytes"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(value("kvtrim_limit_workers"), 2);
  // Every limit of LimitsOf is a registered family, named kvtrim_limit_*.
  for (const Limit& limit : LimitsOf(config)) {
    EXPECT_EQ(limit.name.rfind("kvtrim_limit_", 0), 0u) << limit.name;
    EXPECT_EQ(value(limit.name), limit.value) << limit.name;
  }
  // --max_inflight below 1 runs as 1, and the metric says so.
  config.max_inflight = 0;
  EXPECT_EQ(LimitsOf(config)[0].value, 1);
}

TEST(ProcessMetricsTest, FiguresOfThisProcessAreSane) {
  const std::optional<ProcessFigures> figures = ReadProcessFigures();
  ASSERT_TRUE(figures.has_value());
  EXPECT_GT(figures->resident_bytes, 1 << 20);
  EXPECT_GE(figures->virtual_bytes, figures->resident_bytes);
  EXPECT_GT(figures->open_fds, 2);  // at least stdin, stdout, stderr
  EXPECT_TRUE(figures->max_fds < 0 || figures->open_fds <= figures->max_fds);
  EXPECT_GE(figures->cpu_seconds, 0);
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(figures->start_time_seconds, now + 1);
  EXPECT_GT(figures->start_time_seconds, now - 24 * 3600);  // a test starts within a day
  // CPU time only grows.
  volatile double sink = 0;
  for (int i = 0; i < 20'000'000; ++i) sink = sink + i;
  EXPECT_GE(ReadProcessFigures()->cpu_seconds, figures->cpu_seconds);
  const auto families = ProcessCollector().Collect();
  ASSERT_EQ(families.size(), 6u);
  EXPECT_EQ(families[0].name, "process_cpu_seconds_total");
  EXPECT_EQ(families[0].type, prometheus::MetricType::Counter);
}

// kvtrim_gpu_*: one sample per device the reader answers for, labelled with the CUDA ordinal
// and the UUID; a device it cannot read is left out, and none at all gives no family.
TEST(GpuMetricsTest, OneSamplePerDeviceRead) {
  const std::vector<GpuDeviceLabel> devices = {{0, "GPU-aaaa"}, {1, "GPU-bbbb"}, {3, "GPU-dddd"}};
  GpuCollector collector(devices, [](const std::string& uuid) -> std::optional<GpuFigures> {
    if (uuid == "GPU-bbbb") return std::nullopt;  // e.g. the device fell off the bus
    GpuFigures figures;
    figures.memory_used_bytes = uuid == "GPU-aaaa" ? 1e9 : 2e9;
    figures.memory_total_bytes = 80e9;
    figures.utilization = uuid == "GPU-aaaa" ? 0.25 : 1.0;
    return figures;
  });
  const auto families = collector.Collect();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "kvtrim_gpu_memory_used_bytes");
  EXPECT_EQ(families[1].name, "kvtrim_gpu_memory_total_bytes");
  EXPECT_EQ(families[2].name, "kvtrim_gpu_utilization_ratio");
  for (const auto& family : families) {
    EXPECT_EQ(family.type, prometheus::MetricType::Gauge);
    ASSERT_EQ(family.metric.size(), 2u) << family.name;
    EXPECT_EQ(family.metric[0].label[0].value, "0");
    EXPECT_EQ(family.metric[0].label[1].value, "GPU-aaaa");
    EXPECT_EQ(family.metric[1].label[0].value, "3");
  }
  EXPECT_EQ(families[0].metric[1].gauge.value, 2e9);
  EXPECT_EQ(families[2].metric[0].gauge.value, 0.25);
  GpuCollector unread(devices, [](const std::string&) { return std::optional<GpuFigures>(); });
  EXPECT_TRUE(unread.Collect().empty());
}

// Without the driver (this machine, CI) NVML does not load, and says why; with it (the GPU
// machine) it reads nothing for a UUID no device has.
TEST(GpuMetricsTest, NvmlLoadsOnlyWithTheDriver) {
  std::string why;
  const std::unique_ptr<NvmlReader> nvml = NvmlReader::Load(&why);
  if (nvml == nullptr) {
    EXPECT_FALSE(why.empty());
    return;
  }
  EXPECT_FALSE(nvml->Read("GPU-00000000-0000-0000-0000-000000000000").has_value());
}

/// The CPU backend dressed as a device: each layer reports device 0 and a `wait_seconds`
/// wait for a free worker (slept first, so it is inside the compute time), as the GPU
/// backend's layers do.
class QueuedDeviceBackend final : public Backend {
 public:
  explicit QueuedDeviceBackend(double wait_seconds) : cpu_(1), wait_(wait_seconds) {}
  const char* name() const override { return "queued-device"; }
  absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_));
    const absl::Status status = cpu_.CompressLayer(policy, layer, budget, out);
    out->device = 0;
    out->profile.worker_wait = wait_;
    return status;
  }
  absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                          const LayerBudget& budget, LayerScores* out) override {
    return cpu_.ScoreLayer(policy, layer, budget, out);
  }
  absl::Status CompressByPerturbation(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                      const LayerBudget& budget, const PerturbationSearch& search,
                                      LayerDecision* out) override {
    return cpu_.CompressByPerturbation(policy, layer, budget, search, out);
  }
  std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                      const AllocatorSpec& allocator) const override {
    return cpu_.NumericsModes(scorer, allocator);
  }

 private:
  CpuBackend cpu_;
  double wait_;
};

// stage="queue": a device layer's wait for a free worker is observed as queue time and left
// out of its compute time; the CPU backend's layers observe no queue.
TEST(StageMetricsTest, ADeviceLayersWorkerWaitIsQueueTimeNotCompute) {
  auto server = Server::StartWithBackend(TestConfig(), std::make_unique<QueuedDeviceBackend>(0.05),
                                         std::clog);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto queue_before = HistogramCount(**server, "kvtrim_stage_duration_seconds",
                                           {{"stage", "queue"}});
  auto stub = v1::Kvtrim::NewStub(Connect(**server));
  ASSERT_TRUE(CallCompress(*stub, MakeRequest("knorm")).ok());
  const auto families = (*server)->metrics().registry()->Collect();
  const auto* queue = FindMetric(families, "kvtrim_stage_duration_seconds", {{"stage", "queue"}});
  const auto* compute =
      FindMetric(families, "kvtrim_stage_duration_seconds", {{"stage", "compute"}});
  ASSERT_NE(queue, nullptr);
  ASSERT_NE(compute, nullptr);
  EXPECT_EQ(queue->histogram.sample_count, queue_before + 1);  // one layer
  const double queued = 0.05 * static_cast<double>(queue->histogram.sample_count);
  EXPECT_NEAR(queue->histogram.sample_sum, queued, 1e-9);
  // Every layer (warm-up included) slept 50 ms as its "queue"; compute holds none of it.
  EXPECT_LT(compute->histogram.sample_sum, 0.05 * 0.5 * queue->histogram.sample_count);

  auto cpu = StartServer(TestConfig());
  ASSERT_NE(cpu, nullptr);
  auto cpu_stub = v1::Kvtrim::NewStub(Connect(*cpu));
  ASSERT_TRUE(CallCompress(*cpu_stub, MakeRequest("knorm")).ok());
  EXPECT_EQ(HistogramCount(*cpu, "kvtrim_stage_duration_seconds", {{"stage", "queue"}}), 0u);
}

TEST(MetricsHttpTest, ExporterServesMetrics) {
  Config config = TestConfig();
  config.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->metrics_port(), 0);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  ASSERT_TRUE(CallCompress(*stub, MakeRequest("knorm")).ok());
  const std::string text = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_THAT(text, ::testing::HasSubstr("200 OK"));
  EXPECT_THAT(text, ::testing::HasSubstr("kvtrim_build_info{backend=\"cpu\""));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "kvtrim_requests_total{code=\"OK\",policy=\"knorm\",rpc=\"Compress\"} 1"));
  EXPECT_THAT(text, ::testing::HasSubstr("kvtrim_stage_duration_seconds_bucket{stage=\"compute\""));
  EXPECT_THAT(text, ::testing::HasSubstr("\nprocess_resident_memory_bytes "));
  EXPECT_THAT(text, ::testing::HasSubstr("\nprocess_cpu_seconds_total "));
  EXPECT_THAT(text, ::testing::HasSubstr("\nkvtrim_limit_inflight_requests 256"));
}

TEST(ServerStartTest, PortInUseIsUnavailable) {
  auto first = StartServer(TestConfig());
  ASSERT_NE(first, nullptr);
  Config config = TestConfig();
  config.listen = first->address();
  std::ostringstream log;
  auto second = Server::Start(config, log);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("--listen"));
}

TEST(ServerStartTest, ListensOnUnixSocket) {
  Config config = TestConfig();
  config.listen = "unix:" + kvtrim::testing::TestPath("kvtrimd.sock");
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->address(), config.listen);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  EXPECT_TRUE(CallCompress(*stub, MakeRequest("knorm")).ok());
}

TEST(ServerStartTest, ListensOnUnixSocketUri) {
  // The URI form unix:///ABSOLUTE/PATH (docs/transports.md, node-local workers).
  Config config = TestConfig();
  config.listen = "unix://" + kvtrim::testing::TestPath("kvtrimd_uri.sock");
  ASSERT_EQ(config.listen.rfind("unix:///", 0), 0u) << config.listen;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->address(), config.listen);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  EXPECT_TRUE(CallCompress(*stub, MakeRequest("knorm")).ok());
}

TEST(ServerStartTest, InvalidConfigIsRejected) {
  Config config = TestConfig();
  config.workers = 0;
  std::ostringstream log;
  auto server = Server::Start(config, log);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()), ::testing::HasSubstr("--workers"));
}

TEST(ServerStartTest, StartupLineNamesAddressBackendAndWorkers) {
  std::ostringstream log;
  auto server = Server::Start(TestConfig(), log);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(log.str(), ::testing::HasSubstr((*server)->address()));
  EXPECT_THAT(log.str(), ::testing::HasSubstr("backend cpu"));
  EXPECT_THAT(log.str(), ::testing::HasSubstr("workers 2"));
  EXPECT_THAT(log.str(), ::testing::HasSubstr("metrics disabled"));
}

}  // namespace
}  // namespace kvtrim::service::testing
