// Helpers shared by the service tests: an in-process kvtrimd, request builders, health and
// metrics readers. Test-only (included by service/*_test.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "gtest/gtest.h"
#include "base/dtype.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "prometheus/metric_family.h"
#include "service/server.h"

namespace kvtrim::service::testing {

/// Asserts a gRPC status has exactly `code` and a message containing `fragment`.
#define EXPECT_GRPC_ERROR(status_expr, expected_code, fragment)                        \
  do {                                                                                 \
    const ::grpc::Status _s = (status_expr);                                           \
    EXPECT_EQ(_s.error_code(), (expected_code)) << "message: " << _s.error_message();  \
    EXPECT_THAT(_s.error_message(), ::testing::HasSubstr(fragment));                   \
  } while (0)

/// The numerics modes the CPU backend lists for a policy over `scorer`, as ListPolicies
/// gives them: FAST then EXACT (every scorer has a fast CPU path, kernels/cpu/fast/).
inline std::vector<int> CpuNumericsModes(const std::string& scorer) {
  (void)scorer;
  return {v1::NUMERICS_FAST, v1::NUMERICS_EXACT};
}

/// A config for an in-process server on 127.0.0.1 with an ephemeral port, no exporter, on
/// the CPU backend (the tests' expectations name it; a GPU machine would pick the GPU).
inline Config TestConfig() {
  Config config;
  config.backend = BackendKind::kCpu;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "";
  config.workers = 2;
  config.max_inflight = 256;
  config.max_message_bytes = int64_t{16} << 20;
  config.drain_timeout_s = 5;
  return config;
}

/// Starts a server (logging to std::clog) or fails the test.
inline std::unique_ptr<Server> StartServer(const Config& config) {
  auto server = Server::Start(config, std::clog);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

/// A TCP channel to `server` (max send size unlimited; receive raised to 64 MiB).
inline std::shared_ptr<grpc::Channel> Connect(const Server& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args);
}

/// A test suite sharing one in-process kvtrimd (TestConfig) and its stub, started before the
/// suite's first test and stopped after its last.
class SharedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = StartServer(TestConfig()).release();
    stub_ = v1::Kvtrim::NewStub(Connect(*server_)).release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete server_;
    stub_ = nullptr;
    server_ = nullptr;
  }

  static inline Server* server_ = nullptr;
  static inline v1::Kvtrim::Stub* stub_ = nullptr;
};

/// Deterministic values in [-1, 1).
inline std::vector<float> Values(int64_t count, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(count));
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(static_cast<double>(state >> 40) / 16777216.0) * 2.0f - 1.0f;
  }
  return out;
}

/// A tensor of `shape` holding `values` encoded as `dtype`.
inline v1::Tensor MakeTensor(v1::DType dtype, const std::vector<int64_t>& shape,
                             const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t s : shape) t.add_shape(s);
  std::string bytes;
  if (dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16) {
    std::vector<uint16_t> half(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      half[i] = dtype == v1::DTYPE_F16 ? FloatToF16(values[i]) : FloatToBf16(values[i]);
    }
    bytes.assign(reinterpret_cast<const char*>(half.data()), half.size() * 2);
  } else {
    bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  t.set_inline_data(std::move(bytes));
  return t;
}

/// Dimensions of a synthetic layer.
struct LayerDims {
  int64_t kv_heads = 2;     // H_kv
  int64_t tokens = 64;      // n
  int64_t head_dim = 8;     // d
  int64_t query_heads = 4;  // H_q
  int64_t window = 32;      // w (snapkv's default window is 32)
  bool values = true;
  bool queries = true;
  v1::DType dtype = v1::DTYPE_F32;
};

/// A layer with keys [H_kv, n, d], values [H_kv, n, d] and queries [H_q, w, d].
inline v1::LayerInput MakeLayer(int32_t layer_id, const LayerDims& dims = {}, uint64_t seed = 1) {
  v1::LayerInput layer;
  layer.set_layer_id(layer_id);
  const int64_t kv = dims.kv_heads * dims.tokens * dims.head_dim;
  *layer.mutable_keys() = MakeTensor(dims.dtype, {dims.kv_heads, dims.tokens, dims.head_dim},
                                     Values(kv, seed * 3 + layer_id * 101));
  if (dims.values) {
    *layer.mutable_values() = MakeTensor(dims.dtype, {dims.kv_heads, dims.tokens, dims.head_dim},
                                         Values(kv, seed * 3 + 1 + layer_id * 101));
  }
  if (dims.queries) {
    *layer.mutable_queries() =
        MakeTensor(dims.dtype, {dims.query_heads, dims.window, dims.head_dim},
                   Values(dims.query_heads * dims.window * dims.head_dim,
                          seed * 3 + 2 + layer_id * 101));
  }
  return layer;
}

/// Settings with `policy` and keep_fraction `fraction`.
inline v1::CompressionSettings MakeSettings(const std::string& policy, double fraction = 0.5) {
  v1::CompressionSettings s;
  s.mutable_policy()->set_name(policy);
  s.mutable_budget()->set_keep_fraction(fraction);
  return s;
}

/// A Compress request with `layers` synthetic layers (ids 0..layers-1).
inline v1::CompressRequest MakeRequest(const std::string& policy, int layers = 1,
                                       const LayerDims& dims = {}) {
  v1::CompressRequest r;
  *r.mutable_settings() = MakeSettings(policy);
  for (int i = 0; i < layers; ++i) *r.add_layers() = MakeLayer(i, dims);
  return r;
}

/// Calls Compress with a 30 s deadline.
inline grpc::Status CallCompress(v1::Kvtrim::Stub& stub, const v1::CompressRequest& request,
                                 v1::CompressResponse* response = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CompressResponse local;
  return stub.Compress(&context, request, response ? response : &local);
}

/// grpc.health.v1.Health/Check for `service`: returns the ServingStatus number (1 SERVING,
/// 2 NOT_SERVING) or -1 with `status` set when the call fails. Hand-encodes the two tiny
/// messages (HealthCheckRequest{string service = 1}, HealthCheckResponse{enum status = 1}).
inline int HealthCheck(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                       grpc::Status* status = nullptr) {
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0A);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &context, request_buffer, &response_buffer);
  if (status != nullptr) *status = s;
  if (!s.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  if (bytes.empty()) return 0;  // UNKNOWN (the default value is not serialised)
  if (bytes.size() < 2 || bytes[0] != 0x08) return -1;
  return static_cast<unsigned char>(bytes[1]);
}

/// Finds the metric of family `name` whose labels include every pair of `labels`.
inline const prometheus::ClientMetric* FindMetric(
    const std::vector<prometheus::MetricFamily>& families, const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const auto& family : families) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      bool all = true;
      for (const auto& [key, value] : labels) {
        bool found = false;
        for (const auto& l : metric.label) found |= l.name == key && l.value == value;
        all &= found;
      }
      if (all) return &metric;
    }
  }
  return nullptr;
}

/// Counter value (0 when the series does not exist yet).
inline double CounterValue(Server& server, const std::string& name,
                           const std::vector<std::pair<std::string, std::string>>& labels) {
  const auto families = server.metrics().registry()->Collect();
  const auto* m = FindMetric(families, name, labels);
  return m ? m->counter.value : 0;
}

/// Histogram sample count (0 when the series does not exist yet).
inline uint64_t HistogramCount(Server& server, const std::string& name,
                               const std::vector<std::pair<std::string, std::string>>& labels) {
  const auto families = server.metrics().registry()->Collect();
  const auto* m = FindMetric(families, name, labels);
  return m ? m->histogram.sample_count : 0;
}

/// Session messages: begin with `settings`, one layer, finish.
inline v1::SessionRequest SessionBegin(const v1::CompressionSettings& settings) {
  v1::SessionRequest r;
  *r.mutable_begin() = settings;
  return r;
}
inline v1::SessionRequest SessionLayer(const v1::LayerInput& layer) {
  v1::SessionRequest r;
  *r.mutable_layer() = layer;
  return r;
}
inline v1::SessionRequest SessionFinish() {
  v1::SessionRequest r;
  r.mutable_finish();
  return r;
}

/// Runs `request` as one CompressSession with a 30 s deadline: begin with its settings, its
/// layers, then finish when `finish`; appends every answer to `responses`. Returns the
/// call's final status.
inline grpc::Status CallSession(v1::Kvtrim::Stub& stub, const v1::CompressRequest& request,
                                bool finish, std::vector<v1::SessionResponse>* responses) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub.CompressSession(&context);
  stream->Write(SessionBegin(request.settings()));
  for (const auto& layer : request.layers()) stream->Write(SessionLayer(layer));
  if (finish) stream->Write(SessionFinish());
  stream->WritesDone();
  v1::SessionResponse response;
  while (stream->Read(&response)) responses->push_back(response);
  return stream->Finish();
}

}  // namespace kvtrim::service::testing
