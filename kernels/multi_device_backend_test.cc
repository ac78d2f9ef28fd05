// MultiDeviceBackend's routing with stand-in device backends: device tensors run where
// they live, host layers go to the least loaded device, misplaced tensors and model-wide
// scores split over devices are refused naming the field, health is every device's.
#include "kernels/multi_device_backend.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtrim {
namespace {

using ::testing::HasSubstr;

/// Resident scores that hold nothing.
class NoScores final : public ResidentScores {
 public:
  size_t bytes() const override { return 0; }
};

/// A device backend that counts its calls and can hold them until released.
class CountingBackend final : public Backend {
 public:
  const char* name() const override { return "gpu"; }
  absl::Status CompressLayer(const ResolvedPolicy&, const ValidatedLayer&, const LayerBudget&,
                             LayerDecision* out) override {
    ++compress_calls;
    Block();
    out->offsets = {0, 0};
    return absl::OkStatus();
  }
  absl::Status ScoreLayer(const ResolvedPolicy&, const ValidatedLayer&, const LayerBudget&,
                          LayerScores*) override {
    ++score_calls;
    return absl::OkStatus();
  }
  absl::Status ScoreLayerForModelWide(const ResolvedPolicy&, const ValidatedLayer&,
                                      const LayerBudget&, LayerScores* out) override {
    ++score_calls;
    out->resident = std::make_shared<NoScores>();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<LayerDecision>> DecideModelWide(
      const ResolvedPolicy&, const std::vector<LayerScores>& layers) override {
    ++decide_calls;
    return std::vector<LayerDecision>(layers.size());
  }
  bool reads_device_memory() const override { return true; }
  bool healthy() const override { return is_healthy.load(); }

  /// Makes CompressLayer wait until Release().
  void Hold() {
    std::lock_guard<std::mutex> lock(mutex_);
    holding_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      holding_ = false;
    }
    changed_.notify_all();
  }

  std::atomic<int> compress_calls{0};
  std::atomic<int> score_calls{0};
  std::atomic<int> decide_calls{0};
  std::atomic<bool> is_healthy{true};

 private:
  void Block() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !holding_; });
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  bool holding_ = false;
};

/// Stand-in device memory: an address inside memory_[k] lives on CUDA ordinal kOrdinals[k].
constexpr int kOrdinals[] = {3, 5, 9};  // 9 is not served
char memory[3][64];

int Locate(const void* address) {
  const char* p = static_cast<const char*>(address);
  for (int k = 0; k < 3; ++k) {
    if (p >= memory[k] && p < memory[k] + 64) return kOrdinals[k];
  }
  return -1;
}

/// Two served devices (ordinals 3 and 5) over CountingBackends.
struct TwoDevices {
  TwoDevices() {
    std::vector<MultiDeviceBackend::Device> devices;
    for (int k = 0; k < 2; ++k) {
      auto backend = std::make_unique<CountingBackend>();
      counting[k] = backend.get();
      devices.push_back({kOrdinals[k], std::move(backend)});
    }
    multi = std::make_unique<MultiDeviceBackend>(std::move(devices), Locate);
  }
  CountingBackend* counting[2] = {nullptr, nullptr};
  std::unique_ptr<MultiDeviceBackend> multi;
};

/// A layer whose keys (and values, queries) are host tensors, or device tensors at `where`.
ValidatedLayer Layer(const void* keys_on = nullptr, const void* values_on = nullptr) {
  static const float host[4] = {0, 0, 0, 0};
  ValidatedLayer layer;
  layer.keys.data = keys_on != nullptr ? keys_on : host;
  layer.keys.space = keys_on != nullptr ? MemorySpace::kDevice : MemorySpace::kHost;
  if (values_on != nullptr) {
    layer.values.data = values_on;
    layer.values.space = MemorySpace::kDevice;
  }
  return layer;
}

TEST(MultiDeviceBackendTest, DeviceTensorsRunWhereTheyLive) {
  TwoDevices f;
  ResolvedPolicy policy;
  LayerBudget budget;
  LayerDecision decision;
  ASSERT_TRUE(f.multi->CompressLayer(policy, Layer(memory[1], memory[1] + 8), budget, &decision)
                  .ok());
  EXPECT_EQ(f.counting[0]->compress_calls.load(), 0);
  EXPECT_EQ(f.counting[1]->compress_calls.load(), 1);
  EXPECT_EQ(decision.device, 5);
  ASSERT_TRUE(f.multi->CompressLayer(policy, Layer(memory[0]), budget, &decision).ok());
  EXPECT_EQ(f.counting[0]->compress_calls.load(), 1);
  EXPECT_EQ(decision.device, 3);
  // An output region on the device routes as well.
  ValidatedLayer host_with_output = Layer();
  host_with_output.output.present = true;
  host_with_output.output.device = memory[1];
  ASSERT_TRUE(f.multi->CompressLayer(policy, host_with_output, budget, &decision).ok());
  EXPECT_EQ(f.counting[1]->compress_calls.load(), 2);
  EXPECT_EQ(f.multi->ordinals(), (std::vector<int>{3, 5}));
}

TEST(MultiDeviceBackendTest, MisplacedTensorsAreRefusedNamingTheField) {
  TwoDevices f;
  ResolvedPolicy policy;
  LayerBudget budget;
  LayerDecision decision;
  const absl::Status split =
      f.multi->CompressLayer(policy, Layer(memory[0], memory[1]), budget, &decision);
  EXPECT_EQ(split.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(split.message(), HasSubstr("layer.values: on CUDA device 5 but layer.keys is on "
                                         "device 3"));
  const absl::Status unserved = f.multi->CompressLayer(policy, Layer(memory[2]), budget, &decision);
  EXPECT_EQ(unserved.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unserved.message(), HasSubstr("layer.keys: on CUDA device 9, which this kvtrimd "
                                            "does not serve (--devices=3,5)"));
  EXPECT_EQ(f.counting[0]->compress_calls.load() + f.counting[1]->compress_calls.load(), 0);
}

TEST(MultiDeviceBackendTest, HostLayersAreDealtToTheLeastLoadedDevice) {
  TwoDevices f;
  ResolvedPolicy policy;
  LayerBudget budget;
  // Idle devices share host layers in turn.
  for (int i = 0; i < 10; ++i) {
    LayerDecision decision;
    ASSERT_TRUE(f.multi->CompressLayer(policy, Layer(), budget, &decision).ok());
  }
  EXPECT_EQ(f.counting[0]->compress_calls.load(), 5);
  EXPECT_EQ(f.counting[1]->compress_calls.load(), 5);
  // While device 3 is busy, every host layer goes to device 5. The 11th host layer starts
  // the turn at device 3 again (both idle): it is the one held there.
  f.counting[0]->Hold();
  std::thread busy([&] {
    LayerDecision decision;
    EXPECT_TRUE(f.multi->CompressLayer(policy, Layer(), budget, &decision).ok());
    EXPECT_EQ(decision.device, 3);
  });
  for (int i = 0; i < 2000 && f.multi->inflight()[0] == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(f.multi->inflight()[0], 1);
  const int before = f.counting[1]->compress_calls.load();
  for (int i = 0; i < 6; ++i) {
    LayerDecision decision;
    ASSERT_TRUE(f.multi->CompressLayer(policy, Layer(), budget, &decision).ok());
    EXPECT_EQ(decision.device, 5);
  }
  EXPECT_EQ(f.counting[1]->compress_calls.load(), before + 6);
  f.counting[0]->Release();
  busy.join();
  EXPECT_EQ(f.multi->inflight(), (std::vector<int>{0, 0}));
}

TEST(MultiDeviceBackendTest, ModelWideScoresAreDecidedWhereTheyAre) {
  TwoDevices f;
  ResolvedPolicy policy;
  LayerBudget budget;
  std::vector<LayerScores> layers(2);
  ASSERT_TRUE(f.multi->ScoreLayerForModelWide(policy, Layer(memory[1]), budget, &layers[0]).ok());
  ASSERT_TRUE(f.multi->ScoreLayerForModelWide(policy, Layer(memory[1]), budget, &layers[1]).ok());
  EXPECT_EQ(layers[0].device, 5);
  auto decided = f.multi->DecideModelWide(policy, layers);
  ASSERT_TRUE(decided.ok()) << decided.status();
  EXPECT_EQ(f.counting[1]->decide_calls.load(), 1);
  EXPECT_EQ((*decided)[0].device, 5);
  // Host layers of a model-wide policy all go to the first device.
  std::vector<LayerScores> host(3);
  for (auto& layer : host) ASSERT_TRUE(f.multi->ScoreLayerForModelWide(policy, Layer(), budget, &layer).ok());
  for (const auto& layer : host) EXPECT_EQ(layer.device, 3);
  // Scores kept on two devices cannot be decided together.
  layers[1].device = 3;
  auto split = f.multi->DecideModelWide(policy, layers);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(split.status().message(), HasSubstr("must keep its tensors on one GPU"));
}

TEST(MultiDeviceBackendTest, HealthyOnlyWhileEveryDeviceIs) {
  TwoDevices f;
  EXPECT_TRUE(f.multi->healthy());
  f.counting[1]->is_healthy = false;
  EXPECT_FALSE(f.multi->healthy());
  EXPECT_STREQ(f.multi->name(), "gpu");
  EXPECT_TRUE(f.multi->reads_device_memory());
}

}  // namespace
}  // namespace kvtrim
