// Admission: a session's --max_inflight slot is free before its last message (summary or
// error) reaches the client, and a call the client cancelled gives its slot back at once,
// even while its work is still inside the backend. In both cases the client may already be
// opening its next call; the soak saw such clients refused a limit they never exceeded.
#include <chrono>
#include <future>
#include <thread>

#include "service/scripted_backend_test_util.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

Config OneInflight() {
  Config config = TestConfig();
  config.max_inflight = 1;
  return config;
}

TEST(CancelAdmissionTest, CancelledUnaryCallFreesItsSlotWhileItsLayerIsStillRunning) {
  Fixture f(OneInflight());
  ASSERT_NE(f.server, nullptr);
  grpc::ClientContext context;
  v1::CompressResponse response;
  auto held = std::async(std::launch::async, [&] {
    return f.stub->Compress(&context, RequestForLayer(kBlockingLayer), &response);
  });
  f.backend->WaitUntilBlocked();
  EXPECT_EQ(f.server->service().inflight(), 1);
  context.TryCancel();
  EXPECT_EQ(held.get().error_code(), grpc::StatusCode::CANCELLED);
  // The layer is still blocked inside the backend, yet the slot is free for the next call.
  EXPECT_TRUE(Eventually([&f] { return f.server->service().inflight() == 0; }));
  const grpc::Status next = CallCompress(*f.stub, RequestForLayer(0));
  EXPECT_TRUE(next.ok()) << next.error_message();
  f.backend->Release();
}

TEST(CancelAdmissionTest, CancelledSessionFreesItsSlotWhileItsLayerIsStillRunning) {
  Fixture f(OneInflight());
  ASSERT_NE(f.server, nullptr);
  const v1::CompressRequest request = RequestForLayer(kBlockingLayer);
  grpc::ClientContext context;
  auto stream = f.stub->CompressSession(&context);
  ASSERT_TRUE(stream->Write(SessionBegin(request.settings())));
  ASSERT_TRUE(stream->Write(SessionLayer(request.layers(0))));
  f.backend->WaitUntilBlocked();
  EXPECT_EQ(f.server->service().inflight(), 1);
  context.TryCancel();
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&f] { return f.server->service().inflight() == 0; }));
  std::vector<v1::SessionResponse> responses;
  const grpc::Status next = CallSession(*f.stub, RequestForLayer(0), /*finish=*/true, &responses);
  EXPECT_TRUE(next.ok()) << next.error_message();
  f.backend->Release();
}

/// Reads `stream` until a message for which `last` holds; false if the stream ends first.
template <class Stream, class Predicate>
bool ReadUntil(Stream& stream, Predicate last) {
  v1::SessionResponse response;
  while (stream.Read(&response)) {
    if (last(response)) return true;
  }
  return false;
}

TEST(CancelAdmissionTest, SessionSummaryArrivesWithTheSlotAlreadyFree) {
  auto server = StartServer(OneInflight());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  const v1::CompressRequest request = RequestForLayer(0);
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    auto stream = stub->CompressSession(&context);
    ASSERT_TRUE(stream->Write(SessionBegin(request.settings())));
    ASSERT_TRUE(stream->Write(SessionLayer(request.layers(0))));
    ASSERT_TRUE(stream->Write(SessionFinish()));
    ASSERT_TRUE(ReadUntil(*stream, [](const auto& r) { return r.has_finished(); }));
    ASSERT_EQ(server->service().inflight(), 0) << "session " << i;
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
  }
}

TEST(CancelAdmissionTest, SessionErrorArrivesWithTheSlotAlreadyFree) {
  auto server = StartServer(OneInflight());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  v1::CompressRequest request = RequestForLayer(0);
  request.mutable_layers(0)->mutable_keys()->mutable_inline_data()->resize(100);
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext context;
    auto stream = stub->CompressSession(&context);
    ASSERT_TRUE(stream->Write(SessionBegin(request.settings())));
    stream->Write(SessionLayer(request.layers(0)));
    ASSERT_TRUE(ReadUntil(*stream, [](const auto& r) { return r.has_error(); }));
    ASSERT_EQ(server->service().inflight(), 0) << "session " << i;
    stream->WritesDone();
    ASSERT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

}  // namespace
}  // namespace kvtrim::service::testing
