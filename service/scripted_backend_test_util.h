// Test support: a backend whose behaviour is scripted by layer id (blocking, device
// failures) and an in-process server on it, for tests of the serving path that need a call
// held inside the backend or a device error on demand.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "kernels/cpu/cpu_backend.h"
#include "service/server.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {

/// Layer ids that script the backend's behaviour.
constexpr int32_t kBlockingLayer = 7;   // waits until Release()
constexpr int32_t kExhaustedLayer = 8;  // RESOURCE_EXHAUSTED, stays healthy
constexpr int32_t kStickyLayer = 9;     // INTERNAL and unhealthy from then on
constexpr int32_t kGlitchLayer = 6;     // INTERNAL, stays healthy

/// The CPU backend, with failures scripted by layer id (see the constants above).
class ScriptedBackend final : public Backend {
 public:
  const char* name() const override { return "scripted"; }
  bool healthy() const override { return healthy_.load(); }

  absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++calls_[layer.layer_id];
    }
    switch (layer.layer_id) {
      case kBlockingLayer: {
        {
          std::unique_lock<std::mutex> lock(mutex_);
          blocked_ = true;
          changed_.notify_all();
          changed_.wait(lock, [this] { return released_; });
        }
        break;
      }
      case kExhaustedLayer:
        return absl::ResourceExhaustedError("cudaMalloc: out of memory (scripted)");
      case kGlitchLayer:
        return absl::InternalError("LaunchScore: cudaErrorInvalidValue (scripted, not sticky)");
      case kStickyLayer:
        healthy_.store(false);
        return absl::InternalError("LaunchScore: cudaErrorIllegalAddress (scripted, sticky)");
      default:
        break;
    }
    return cpu_.CompressLayer(policy, layer, budget, out);
  }

  /// Blocks until a kBlockingLayer call is waiting inside the backend.
  void WaitUntilBlocked() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return blocked_; });
  }
  /// CompressLayer calls for layer `layer_id` so far (entered, finished or not).
  int calls(int32_t layer_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_[layer_id];
  }
  /// Lets kBlockingLayer calls finish.
  void Release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  CpuBackend cpu_{1};
  std::atomic<bool> healthy_{true};
  std::map<int32_t, int> calls_;  // by layer id, under mutex_
  std::mutex mutex_;
  std::condition_variable changed_;
  bool blocked_ = false;
  bool released_ = false;
};

/// Polls (bounded, 10 s) until `done` holds; true when it did. For server state that
/// changes after the client has its answer (slots, waiters).
template <class Predicate>
bool Eventually(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// A request whose only layer has id `layer_id`.
inline v1::CompressRequest RequestForLayer(int32_t layer_id) {
  v1::CompressRequest r;
  *r.mutable_settings() = MakeSettings("snapkv");
  *r.add_layers() = MakeLayer(layer_id);
  return r;
}

/// An in-process server on a ScriptedBackend, a channel and a stub to it.
struct Fixture {
  ScriptedBackend* backend = nullptr;  // owned by the server
  std::ostringstream log;
  std::unique_ptr<Server> server;
  std::unique_ptr<v1::Kvtrim::Stub> stub;
  std::shared_ptr<grpc::Channel> channel;

  explicit Fixture(const Config& config = TestConfig()) {
    auto owned = std::make_unique<ScriptedBackend>();
    backend = owned.get();
    auto started = Server::StartWithBackend(config, std::move(owned), log);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    server = *std::move(started);
    channel = Connect(*server);
    stub = v1::Kvtrim::NewStub(channel);
  }
};

}  // namespace kvtrim::service::testing
