// --admission_wait_ms: a Compress or CompressSession call that finds every --max_inflight
// slot taken waits (bounded) for one instead of being refused at once. A cancelled call's
// slot comes back only when the server sees the cancellation, which may be after its client
// has already sent its next call; the soak's 64 clients at --max_inflight=64 were refused
// for that reason.
#include <chrono>
#include <future>
#include <thread>

#include "service/admission_gate.h"
#include "service/scripted_backend_test_util.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

using Clock = std::chrono::steady_clock;

/// One inflight slot; a call finding it taken waits up to `wait_ms`.
Config OneSlotWaiting(int wait_ms) {
  Config config = TestConfig();
  config.max_inflight = 1;
  config.admission_wait_ms = wait_ms;
  return config;
}

/// Holds the only slot with a unary call blocked inside the scripted backend.
struct HeldSlot {
  grpc::ClientContext context;
  v1::CompressResponse response;
  std::future<grpc::Status> status;

  explicit HeldSlot(Fixture& f) {
    status = std::async(std::launch::async, [this, &f] {
      return f.stub->Compress(&context, RequestForLayer(kBlockingLayer), &response);
    });
    f.backend->WaitUntilBlocked();
  }
};

TEST(AdmissionGateTest, WaiterTakesTheSlotReleasedDuringItsWait) {
  AdmissionGate gate(1, 1);
  ASSERT_TRUE(gate.TryAcquire());
  EXPECT_FALSE(gate.TryAcquire());
  ASSERT_TRUE(gate.StartWaiting());
  EXPECT_FALSE(gate.StartWaiting());  // one waiter at most
  auto waited = std::async(std::launch::async, [&gate] {
    return gate.AwaitSlot(Clock::now() + std::chrono::seconds(10), [] { return false; });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  gate.Release();
  EXPECT_TRUE(waited.get());
  EXPECT_EQ(gate.in_use(), 1);
  EXPECT_EQ(gate.waiting(), 0);
}

TEST(AdmissionGateTest, WaiterGivesUpAtItsDeadlineOrWhenAskedTo) {
  AdmissionGate gate(1, 2);
  ASSERT_TRUE(gate.TryAcquire());
  ASSERT_TRUE(gate.StartWaiting());
  const auto start = Clock::now();
  EXPECT_FALSE(gate.AwaitSlot(start + std::chrono::milliseconds(50), [] { return false; }));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(50));
  ASSERT_TRUE(gate.StartWaiting());
  EXPECT_FALSE(gate.AwaitSlot(Clock::now() + std::chrono::seconds(60), [] { return true; }));
  ASSERT_TRUE(gate.StartWaiting());
  gate.StopWaiting();
  EXPECT_EQ(gate.waiting(), 0);
  EXPECT_EQ(gate.in_use(), 1);
}

TEST(AdmissionWaitTest, UnaryCallGetsTheSlotFreedDuringItsWait) {
  Fixture f(OneSlotWaiting(10000));
  ASSERT_NE(f.server, nullptr);
  HeldSlot held(f);
  auto next = std::async(std::launch::async,
                         [&f] { return CallCompress(*f.stub, RequestForLayer(0)); });
  ASSERT_TRUE(Eventually([&f] { return f.server->service().admission_waiting() == 1; }));
  f.backend->Release();
  EXPECT_TRUE(held.status.get().ok());
  const grpc::Status status = next.get();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(f.server->service().admission_waiting(), 0);
  EXPECT_TRUE(Eventually([&f] { return f.server->service().inflight() == 0; }));
}

TEST(AdmissionWaitTest, SessionGetsTheSlotOfACallCancelledDuringItsWait) {
  Fixture f(OneSlotWaiting(10000));
  ASSERT_NE(f.server, nullptr);
  HeldSlot held(f);
  auto next = std::async(std::launch::async, [&f] {
    std::vector<v1::SessionResponse> responses;
    return CallSession(*f.stub, RequestForLayer(0), /*finish=*/true, &responses);
  });
  ASSERT_TRUE(Eventually([&f] { return f.server->service().admission_waiting() == 1; }));
  held.context.TryCancel();  // the slot goes back while the layer is still blocked
  const grpc::Status status = next.get();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(held.status.get().error_code(), grpc::StatusCode::CANCELLED);
  f.backend->Release();
}

TEST(AdmissionWaitTest, CallsStillWaitingAtTheEndOfTheWaitAreRefusedNamingIt) {
  Fixture f(OneSlotWaiting(100));
  ASSERT_NE(f.server, nullptr);
  HeldSlot held(f);
  const auto start = Clock::now();
  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(0)),
                    grpc::StatusCode::RESOURCE_EXHAUSTED,
                    "max_inflight: 1 Compress/CompressSession calls stayed in flight for the "
                    "whole admission wait (--admission_wait_ms=100); retry with backoff");
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100));
  std::vector<v1::SessionResponse> responses;
  EXPECT_GRPC_ERROR(CallSession(*f.stub, RequestForLayer(0), /*finish=*/true, &responses),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, "--admission_wait_ms=100");
  EXPECT_EQ(f.server->service().admission_waiting(), 0);
  f.backend->Release();
  EXPECT_TRUE(held.status.get().ok());
}

TEST(AdmissionWaitTest, CallsBeyondMaxInflightWaitersAreRefusedAtOnce) {
  Fixture f(OneSlotWaiting(10000));
  ASSERT_NE(f.server, nullptr);
  HeldSlot held(f);
  auto waiter = std::async(std::launch::async,
                           [&f] { return CallCompress(*f.stub, RequestForLayer(0)); });
  ASSERT_TRUE(Eventually([&f] { return f.server->service().admission_waiting() == 1; }));
  // max_inflight (1) calls wait already: the next is refused without waiting.
  const auto start = Clock::now();
  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(0)),
                    grpc::StatusCode::RESOURCE_EXHAUSTED,
                    "max_inflight: 1 Compress/CompressSession calls are already in flight");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  f.backend->Release();
  EXPECT_TRUE(held.status.get().ok());
  EXPECT_TRUE(waiter.get().ok());
}

TEST(AdmissionWaitTest, CallCancelledWhileWaitingLeavesNoSlotOrWaiterBehind) {
  Fixture f(OneSlotWaiting(10000));
  ASSERT_NE(f.server, nullptr);
  HeldSlot held(f);
  grpc::ClientContext context;
  v1::CompressResponse response;
  auto waiting = std::async(std::launch::async, [&] {
    return f.stub->Compress(&context, RequestForLayer(0), &response);
  });
  ASSERT_TRUE(Eventually([&f] { return f.server->service().admission_waiting() == 1; }));
  context.TryCancel();
  EXPECT_EQ(waiting.get().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&f] { return f.server->service().admission_waiting() == 0; }));
  EXPECT_EQ(f.server->service().inflight(), 1);  // the held call's, nothing more
  f.backend->Release();
  EXPECT_TRUE(held.status.get().ok());
  EXPECT_TRUE(Eventually([&f] { return f.server->service().inflight() == 0; }));
  EXPECT_TRUE(CallCompress(*f.stub, RequestForLayer(0)).ok());
}

TEST(AdmissionWaitTest, ZeroWaitRefusesAtOnce) {
  Fixture f(OneSlotWaiting(0));
  ASSERT_NE(f.server, nullptr);
  HeldSlot held(f);
  EXPECT_GRPC_ERROR(CallCompress(*f.stub, RequestForLayer(0)),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, "are already in flight");
  EXPECT_EQ(f.server->service().admission_waiting(), 0);
  f.backend->Release();
  EXPECT_TRUE(held.status.get().ok());
}

}  // namespace
}  // namespace kvtrim::service::testing
