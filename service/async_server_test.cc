// The asynchronous server: idle Regions leases hold no threads and count against
// --max_leases; cancelling them frees their slots; a session waiting for its client holds
// no thread either.
#include <dirent.h>

#include <memory>
#include <thread>
#include <vector>

#include "service/transport_test_util.h"

namespace kvtrim::service::testing {
namespace {

/// Threads of this process now (the in-process server's included).
int ProcessThreads() {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

/// Waits up to 5 s for `condition`.
template <class Condition>
bool Eventually(Condition condition) {
  for (int i = 0; i < 500; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

constexpr int kMaxLeases = 500;

TEST(AsyncServerTest, IdleLeasesHoldNoThreadsAndCountAgainstMaxLeases) {
  Config config = TestConfig();
  config.allow_client_shm = true;
  config.max_leases = kMaxLeases;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  ASSERT_TRUE(CallCompress(*stub, MakeRequest("snapkv")).ok());  // the connection is up
  const int threads_before = ProcessThreads();
  ASSERT_GT(threads_before, 0);

  std::vector<std::unique_ptr<TestLease>> leases;
  for (int i = 0; i < kMaxLeases; ++i) {
    leases.push_back(std::make_unique<TestLease>(*stub));
    ASSERT_FALSE(leases.back()->client_id().empty()) << "lease " << i;
  }
  EXPECT_EQ(server->service().leases(), kMaxLeases);
  // The synchronous server held one thread per open stream; now an idle lease costs none
  // (a few threads of gRPC's own pollers and our work pool may come and go).
  const int threads_with_leases = ProcessThreads();
  EXPECT_LT(threads_with_leases - threads_before, 32)
      << threads_before << " threads before, " << threads_with_leases << " with "
      << kMaxLeases << " idle leases";

  // One more is refused, naming the limit; the server keeps serving.
  TestLease refused(*stub);
  EXPECT_TRUE(refused.client_id().empty());
  EXPECT_GRPC_ERROR(refused.RefusedStatus(), grpc::StatusCode::RESOURCE_EXHAUSTED, "max_leases");
  EXPECT_TRUE(CallCompress(*stub, MakeRequest("snapkv")).ok());

  // Cancelling leases frees their slots for new ones.
  for (int i = 0; i < 10; ++i) leases[static_cast<size_t>(i)]->Cancel();
  ASSERT_TRUE(Eventually([&] { return server->service().leases() == kMaxLeases - 10; }))
      << server->service().leases();
  for (int i = 0; i < 10; ++i) {
    leases.push_back(std::make_unique<TestLease>(*stub));
    EXPECT_FALSE(leases.back()->client_id().empty()) << "lease " << i << " after the cancels";
  }
  TestLease refused_again(*stub);  // at the limit once more
  EXPECT_GRPC_ERROR(refused_again.RefusedStatus(), grpc::StatusCode::RESOURCE_EXHAUSTED,
                    "max_leases");
  leases.clear();  // half-closes every lease
  EXPECT_TRUE(Eventually([&] { return server->service().leases() == 0; }))
      << server->service().leases();
}

TEST(AsyncServerTest, SessionsWaitingForTheirClientHoldNoThreads) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  ASSERT_TRUE(CallCompress(*stub, MakeRequest("snapkv")).ok());
  const int threads_before = ProcessThreads();
  constexpr int kSessions = 100;
  struct OpenSession {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream;
  };
  std::vector<std::unique_ptr<OpenSession>> sessions;
  const v1::CompressRequest request = MakeRequest("snapkv");
  for (int i = 0; i < kSessions; ++i) {
    auto session = std::make_unique<OpenSession>();
    session->stream = stub->CompressSession(&session->context);
    ASSERT_TRUE(session->stream->Write(SessionBegin(request.settings())));
    ASSERT_TRUE(session->stream->Write(SessionLayer(request.layers(0))));
    v1::SessionResponse answer;
    ASSERT_TRUE(session->stream->Read(&answer));  // one layer answered, then the client idles
    ASSERT_TRUE(answer.has_layer()) << answer.DebugString();
    sessions.push_back(std::move(session));
  }
  EXPECT_EQ(server->service().inflight(), kSessions);
  EXPECT_LT(ProcessThreads() - threads_before, 32);
  for (auto& session : sessions) {
    v1::SessionRequest finish;
    finish.mutable_finish();
    ASSERT_TRUE(session->stream->Write(finish));
    ASSERT_TRUE(session->stream->WritesDone());
    v1::SessionResponse answer;
    while (session->stream->Read(&answer)) {
    }
    EXPECT_TRUE(session->stream->Finish().ok());
  }
  EXPECT_TRUE(Eventually([&] { return server->service().inflight() == 0; }));
}

}  // namespace
}  // namespace kvtrim::service::testing
