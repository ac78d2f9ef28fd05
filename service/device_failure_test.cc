// Device failures through the server (design.md convention 9): RESOURCE_EXHAUSTED and
// non-sticky INTERNAL errors leave kvtrimd SERVING; a sticky one (the backend reports
// itself unhealthy) turns it NOT_SERVING, drains it and makes RunUntilSignal return
// kExitDeviceFailure. A scripted backend stands in for the GPU, so this runs everywhere.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "service/backend_factory.h"
#include "service/scripted_backend_test_util.h"
#include "service/test_util.h"

#if KVTRIM_HAVE_CUDA
#include "kernels/gpu/runtime/device_probe.h"
#endif

namespace kvtrim::service::testing {
namespace {

using ::testing::HasSubstr;

TEST(DeviceFailureTest, ResourceExhaustedKeepsServing) {
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(kExhaustedLayer)),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, "out of memory");
  EXPECT_EQ(HealthCheck(f.channel, kHealthServiceName), 1);
  EXPECT_TRUE(CallCompress(*f.stub, RequestForLayer(0)).ok());
  EXPECT_FALSE(f.server->stopping());
  EXPECT_TRUE(f.server->fatal_error().ok());
}

TEST(DeviceFailureTest, NonStickyInternalKeepsServing) {
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(kGlitchLayer)), grpc::StatusCode::INTERNAL,
                    "not sticky");
  EXPECT_EQ(HealthCheck(f.channel, kHealthServiceName), 1);
  EXPECT_TRUE(CallCompress(*f.stub, RequestForLayer(0)).ok());
  EXPECT_FALSE(f.server->stopping());
}

TEST(DeviceFailureTest, SessionEndsWithTheBackendsOwnStatus) {
  // A failure of the backend in the middle of a session (the client has sent no finish)
  // ends it with a last `error` message and the call's status, both the backend's own.
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  for (const auto& [layer_id, code, fragment] :
       {std::tuple<int32_t, grpc::StatusCode, const char*>{
            kExhaustedLayer, grpc::StatusCode::RESOURCE_EXHAUSTED, "out of memory"},
        {kGlitchLayer, grpc::StatusCode::INTERNAL, "not sticky"}}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = f.stub->CompressSession(&context);
    v1::CompressRequest request = RequestForLayer(0);
    ASSERT_TRUE(stream->Write(SessionBegin(request.settings())));
    ASSERT_TRUE(stream->Write(SessionLayer(request.layers(0))));
    v1::SessionResponse response;
    ASSERT_TRUE(stream->Read(&response));  // layer 0 answered
    *request.mutable_layers(0) = MakeLayer(layer_id);
    stream->Write(SessionLayer(request.layers(0)));  // fails in the backend; no finish sent
    v1::SessionResponse last;
    while (stream->Read(&response)) last = response;
    const grpc::Status status = stream->Finish();
    // The call ends with the failure's own status, although a read of the client's next
    // message is still pending (the asynchronous server finishes the call around it).
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(fragment));
    // The last message carries the same code and message.
    ASSERT_TRUE(last.has_error()) << last.DebugString();
    EXPECT_EQ(last.error().code(), static_cast<int32_t>(code));
    EXPECT_THAT(last.error().message(), HasSubstr(fragment));
  }
  EXPECT_TRUE(CallCompress(*f.stub, RequestForLayer(0)).ok());
}

/// A snapkv session of layers `ids` then finish, all written before any answer is read.
/// Writing stops at the first write that fails: a session that fails ends the call, and
/// the client's later writes then fail (`all_written` false), which is not an error.
struct WrittenSession {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream;
  bool all_written = false;

  WrittenSession(v1::Kvtrim::Stub& stub, std::initializer_list<int32_t> ids,
                 const LayerDims& dims = {}) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream = stub.CompressSession(&context);
    all_written = stream->Write(SessionBegin(MakeSettings("snapkv")));
    for (int32_t id : ids) {
      all_written = all_written && stream->Write(SessionLayer(MakeLayer(id, dims)));
    }
    all_written = all_written && stream->Write(SessionFinish());
    stream->WritesDone();
  }
};

TEST(DeviceFailureTest, SessionLayersComputeSideBySideAndAnswerInStreamOrder) {
  // --session_parallel_layers (2 by default): the layer after a slow one is computed
  // meanwhile, and its answer still waits for the slow one's.
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  WrittenSession session(*f.stub, {kBlockingLayer, 3, 4});
  ASSERT_TRUE(session.all_written);
  auto& stream = session.stream;
  f.backend->WaitUntilBlocked();
  // Layer 3 enters the backend while layer 7 is held there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.backend->calls(3) < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(f.backend->calls(3), 1) << "the next layer did not start beside the held one";
  f.backend->Release();
  std::vector<int32_t> order;
  v1::SessionResponse response;
  while (stream->Read(&response)) {
    if (response.has_layer()) order.push_back(response.layer().layer_id());
  }
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_EQ(order, (std::vector<int32_t>{kBlockingLayer, 3, 4}));
}

TEST(DeviceFailureTest, SessionLayersWithManyHostBytesComputeOneAtATime) {
  // Over 8 MiB of inline bytes per layer (keys [2, 65536, 16] f32 and the queries): their
  // uploads would compete with the wire, so the next layer waits for the held one.
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  LayerDims big;
  big.tokens = 65536;
  big.head_dim = 16;
  big.values = false;
  WrittenSession session(*f.stub, {kBlockingLayer, 3}, big);
  ASSERT_TRUE(session.all_written);
  f.backend->WaitUntilBlocked();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(f.backend->calls(3), 0) << "a layer with many host bytes started beside another";
  f.backend->Release();
  std::vector<int32_t> order;
  v1::SessionResponse response;
  while (session.stream->Read(&response)) {
    if (response.has_layer()) order.push_back(response.layer().layer_id());
  }
  ASSERT_TRUE(session.stream->Finish().ok());
  EXPECT_EQ(order, (std::vector<int32_t>{kBlockingLayer, 3}));
}

TEST(DeviceFailureTest, AFailedSessionLayerEndsTheSessionAfterTheLayersBeforeIt) {
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  WrittenSession session(*f.stub, {0, kGlitchLayer, 1, 2});
  auto& stream = session.stream;
  std::vector<v1::SessionResponse> responses;
  v1::SessionResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << status.error_message();
  ASSERT_EQ(responses.size(), 2u);  // layer 0, then the error: layers 1 and 2 are dropped
  EXPECT_EQ(responses[0].layer().layer_id(), 0);
  ASSERT_TRUE(responses[1].has_error());
  EXPECT_THAT(responses[1].error().message(), HasSubstr("not sticky"));
  EXPECT_TRUE(CallCompress(*f.stub, RequestForLayer(0)).ok());
}

TEST(DeviceFailureTest, StickyErrorTurnsNotServingDrainsAndExitsThree) {
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  Server& server = *f.server;
  std::ostringstream run_log;
  auto exit_code = std::async(std::launch::async, [&] { return RunUntilSignal(server, run_log); });

  // A call in flight keeps the drain open, so NOT_SERVING can be observed before shutdown.
  auto in_flight = std::async(std::launch::async,
                              [&] { return CallCompress(*f.stub, RequestForLayer(kBlockingLayer)); });
  f.backend->WaitUntilBlocked();

  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(kStickyLayer)), grpc::StatusCode::INTERNAL,
                    "cudaErrorIllegalAddress");
  EXPECT_EQ(HealthCheck(f.channel, kHealthServiceName), 2);  // NOT_SERVING
  EXPECT_EQ(HealthCheck(f.channel, ""), 2);
  EXPECT_EQ(server.fatal_error().code(), absl::StatusCode::kInternal);
  // New work is refused while the drain waits for the call in flight.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!server.stopping() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(server.stopping());
  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(0)), grpc::StatusCode::UNAVAILABLE,
                    "draining");

  f.backend->Release();
  EXPECT_TRUE(in_flight.get().ok());
  ASSERT_EQ(exit_code.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(exit_code.get(), kExitDeviceFailure);
  EXPECT_THAT(f.log.str(), HasSubstr("sticky device error, NOT_SERVING"));
  EXPECT_THAT(f.log.str(), HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_THAT(run_log.str(), HasSubstr("stopped after a sticky device error"));
}

TEST(DeviceFailureTest, BackendAutoWithoutGpuIsCpu) {
#if KVTRIM_HAVE_CUDA
  if (gpu::CountCudaDevices().count > 0) GTEST_SKIP() << "a CUDA device is visible";
#endif
  Config config = TestConfig();
  config.backend = BackendKind::kAuto;
  std::string detail;
  auto backend = CreateBackend(config, &detail);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_STREQ((*backend)->name(), "cpu");
}

TEST(DeviceFailureTest, BackendGpuWithoutDeviceCannotStart) {
#if KVTRIM_HAVE_CUDA
  if (gpu::CountCudaDevices().count > 0) GTEST_SKIP() << "a CUDA device is visible";
  Config config = TestConfig();
  config.backend = BackendKind::kGpu;
  std::ostringstream log;
  auto server = Server::Start(config, log);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("--backend=gpu: no CUDA device is visible"));
#else
  GTEST_SKIP() << "built without CUDA: Config::Validate rejects --backend=gpu (exit 2)";
#endif
}

#if KVTRIM_HAVE_CUDA
TEST(DeviceFailureTest, BackendGpuOnDeviceServesAsGpu) {
  if (gpu::CountCudaDevices().count == 0) GTEST_SKIP() << "no CUDA device";
  Config config = TestConfig();
  config.backend = BackendKind::kGpu;
  auto server = Server::Start(config, std::clog);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Kvtrim::NewStub(Connect(**server));
  v1::CompressResponse response;
  ASSERT_TRUE(CallCompress(*stub, MakeRequest("dropkv"), &response).ok());
  EXPECT_EQ(response.backend(), "gpu");
}
#endif

}  // namespace
}  // namespace kvtrim::service::testing
