// Launch graphs (kernels/gpu/runtime/launch_graph.h, issue 12): a layer's launch sequence seen
// before is replayed as one CUDA graph, and a replay answers exactly what launching one by one
// answers, also when the same addresses hold new data.
//
//   LaunchGraphCache.DirectThenCaptureThenReplay   first sight direct, second captured, then
//                                                  replayed; a replay reads the buffers' new
//                                                  contents; a new key starts over
//   LaunchGraphCache.CapacityEvictsAndZeroTurnsOff least recently used graphs go first; 0 = off
//   LaunchGraphCache.ErrorsDuringCaptureComeBack   an enqueue error is returned, the stream
//                                                  stays usable, the next sight tries again
//   LaunchGraphBackend.ReplaysMatchDirectLaunches  every per-head, AdaKV and shared policy on a
//                                                  one-worker GpuBackend with graphs, two
//                                                  layers of equal shape alternating (same
//                                                  arena and staging addresses, new data), four
//                                                  rounds: each answer equals the graphs-off
//                                                  backend's, list for list
// Skips without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/gpu/runtime/launch_graph.h"
#include "tests/gpu/model_test_data.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

/// A device buffer of `count` floats, freed at scope exit.
struct DeviceFloats {
  explicit DeviceFloats(size_t count) : count(count) {
    EXPECT_EQ(cudaMalloc(&data, count * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data); }
  std::vector<float> Read() const {
    std::vector<float> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  void Write(const std::vector<float>& host) {
    EXPECT_EQ(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  float* data = nullptr;
  size_t count;
};

/// One stream for a test.
struct TestStream {
  TestStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess); }
  ~TestStream() { cudaStreamDestroy(stream); }
  cudaStream_t stream = nullptr;
};

/// A two-launch sequence over `scores` [heads, n]: protection of `sink` and `recent` tokens.
absl::Status ProtectTwice(float* scores, int32_t heads, int64_t n, int64_t sink, int64_t recent,
                          cudaStream_t stream) {
  if (LaunchApplyProtection(scores, heads, n, sink, 0, stream) != cudaSuccess) {
    return absl::InternalError("LaunchApplyProtection(sink)");
  }
  if (LaunchApplyProtection(scores, heads, n, 0, recent, stream) != cudaSuccess) {
    return absl::InternalError("LaunchApplyProtection(recent)");
  }
  return absl::OkStatus();
}

/// The key of ProtectTwice's arguments.
LaunchKey KeyOf(const float* scores, int32_t heads, int64_t n, int64_t sink, int64_t recent) {
  LaunchKey key;
  key.Add(scores).Add(heads).Add(n).Add(sink).Add(recent);
  return key;
}

TEST(LaunchGraphCache, DirectThenCaptureThenReplay) {
  KVTRIM_SKIP_WITHOUT_GPU();
  TestStream s;
  constexpr int32_t kHeads = 2;
  constexpr int64_t kN = 64;
  DeviceFloats scores(kHeads * kN);
  LaunchGraphCache cache(4);
  const LaunchKey key = KeyOf(scores.data, kHeads, kN, 3, 5);
  auto run = [&] { return ProtectTwice(scores.data, kHeads, kN, 3, 5, s.stream); };
  for (int round = 0; round < 4; ++round) {
    // New contents at the same address every round: a replay must read them.
    std::vector<float> host(kHeads * kN);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(round * 1000 + i);
    scores.Write(host);
    ASSERT_TRUE(cache.Run(s.stream, key, run).ok());
    ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
    const std::vector<float> got = scores.Read();
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int64_t j = 0; j < kN; ++j) {
        const size_t i = static_cast<size_t>(h * kN + j);
        const bool kept = j < 3 || j >= kN - 5;
        if (kept) {
          EXPECT_EQ(got[i], INFINITY) << "round " << round << " h " << h << " j " << j;
        } else {
          EXPECT_EQ(got[i], host[i]) << "round " << round << " h " << h << " j " << j;
        }
      }
    }
  }
  EXPECT_EQ(cache.stats().direct, 1);
  EXPECT_EQ(cache.stats().captured, 1);
  EXPECT_EQ(cache.stats().replayed, 2);
  EXPECT_EQ(cache.stats().fallbacks, 0);
  // Another argument is another key: direct again.
  const LaunchKey other = KeyOf(scores.data, kHeads, kN, 4, 5);
  ASSERT_TRUE(cache.Run(s.stream, other, [&] {
    return ProtectTwice(scores.data, kHeads, kN, 4, 5, s.stream);
  }).ok());
  EXPECT_EQ(cache.stats().direct, 2);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
}

TEST(LaunchGraphCache, CapacityEvictsAndZeroTurnsOff) {
  KVTRIM_SKIP_WITHOUT_GPU();
  TestStream s;
  DeviceFloats scores(2 * 64);
  LaunchGraphCache cache(2);
  auto run_sink = [&](int64_t sink) {
    return cache.Run(s.stream, KeyOf(scores.data, 2, 64, sink, 1), [&] {
      return ProtectTwice(scores.data, 2, 64, sink, 1, s.stream);
    });
  };
  // Three keys, each seen twice: three captures, but room for two graphs.
  for (int64_t sink : {1, 2, 3, 1, 2, 3}) ASSERT_TRUE(run_sink(sink).ok());
  EXPECT_EQ(cache.stats().captured, 3);
  // Key 1 was the least recently used graph: gone, so it is captured again; 3 is replayed.
  ASSERT_TRUE(run_sink(3).ok());
  EXPECT_EQ(cache.stats().replayed, 1);
  ASSERT_TRUE(run_sink(1).ok());
  EXPECT_EQ(cache.stats().captured, 4);
  cache.set_capacity(0);
  const int64_t direct = cache.stats().direct;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(run_sink(3).ok());
  EXPECT_EQ(cache.stats().direct, direct + 3);
  EXPECT_EQ(cache.stats().replayed, 1);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
}

TEST(LaunchGraphCache, ErrorsDuringCaptureComeBack) {
  KVTRIM_SKIP_WITHOUT_GPU();
  TestStream s;
  DeviceFloats scores(64);
  LaunchGraphCache cache(4);
  const LaunchKey key = KeyOf(scores.data, 1, 64, 1, 1);
  int calls = 0;
  auto failing_second_time = [&]() -> absl::Status {
    ++calls;
    KVTRIM_RETURN_IF_ERROR(ProtectTwice(scores.data, 1, 64, 1, 1, s.stream));
    if (calls == 2) return absl::InvalidArgumentError("refused while capturing");
    return absl::OkStatus();
  };
  ASSERT_TRUE(cache.Run(s.stream, key, failing_second_time).ok());  // direct
  const absl::Status failed = cache.Run(s.stream, key, failing_second_time);  // capture
  EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument) << failed;
  // The stream is no longer capturing and still works; the next sight captures.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(s.stream, &capturing), cudaSuccess);
  EXPECT_EQ(capturing, cudaStreamCaptureStatusNone);
  ASSERT_TRUE(cache.Run(s.stream, key, failing_second_time).ok());
  EXPECT_EQ(cache.stats().captured, 1);
  ASSERT_TRUE(cache.Run(s.stream, key, failing_second_time).ok());
  EXPECT_EQ(cache.stats().replayed, 1);
  EXPECT_EQ(calls, 3);  // the replay called nothing
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
}

/// Two layers of one shape alternating, four rounds, on a graphs backend and a direct one:
/// every answer equal. `cases` are (policy, output shape, numerics).
struct GraphCase {
  const char* policy;
  OutputShape shape;
  Numerics numerics;
};
void ExpectReplaysMatchDirect(int64_t kv_heads, int64_t group, int64_t n, int64_t d, int64_t window,
                              const std::vector<GraphCase>& cases);

TEST(LaunchGraphBackend, ReplaysMatchDirectLaunches) {
  KVTRIM_SKIP_WITHOUT_GPU();
  ExpectReplaysMatchDirect(4, 2, 3000, 64, 16,
                           {{"knorm", OutputShape::kPerHead, Numerics::kFast},
                            {"snapkv", OutputShape::kPerHead, Numerics::kFast},
                            {"snapkv", OutputShape::kPerHead, Numerics::kExact},
                            {"h2o", OutputShape::kPerHead, Numerics::kFast},
                            {"tova", OutputShape::kPerHead, Numerics::kFast},
                            {"keydiff", OutputShape::kPerHead, Numerics::kFast},
                            {"dropkv", OutputShape::kPerHead, Numerics::kFast},
                            {"random", OutputShape::kPerHead, Numerics::kFast},
                            {"streaming_llm", OutputShape::kPerHead, Numerics::kFast},
                            {"adakv", OutputShape::kPerHead, Numerics::kFast},
                            {"snapkv", OutputShape::kShared, Numerics::kFast}});
}

TEST(LaunchGraphBackend, LargeSharedAndAdaKVReplaysMatchDirectLaunches) {
  KVTRIM_SKIP_WITHOUT_GPU();
  ExpectReplaysMatchDirect(3, 4, 40000, 128, 32,
                           {{"knorm", OutputShape::kShared, Numerics::kFast},
                            {"adakv", OutputShape::kPerHead, Numerics::kFast},
                            {"dropkv", OutputShape::kPerHead, Numerics::kFast}});
}

void ExpectReplaysMatchDirect(int64_t kv_heads, int64_t group, int64_t n, int64_t d, int64_t window,
                              const std::vector<GraphCase>& cases) {
  const DType dtype = DType::kBF16;
  std::unique_ptr<GpuBackend> graphs = OneWorkerBackend(64);
  std::unique_ptr<GpuBackend> direct = OneWorkerBackend(0);
  ASSERT_NE(graphs, nullptr);
  ASSERT_NE(direct, nullptr);
  PolicyEngine with_graphs(BuiltinRegistry(), *graphs);
  PolicyEngine without(BuiltinRegistry(), *direct);
  // Two layers of one shape with different data: staged to the same device addresses.
  const ModelLayerData a = MakeModelLayerData(dtype, kv_heads, n, d, group, window, 11);
  const ModelLayerData b = MakeModelLayerData(dtype, kv_heads, n, d, group, window, 12);
  auto request = [&](const ModelLayerData& data) {
    LayerRequest layer;
    layer.keys = {data.keys.data(), dtype, {kv_heads, n, d}};
    layer.values = {data.values.data(), dtype, {kv_heads, n, d}};
    layer.queries = {data.queries.data(), dtype, {kv_heads * group, window, d}};
    return layer;
  };
  for (const GraphCase& c : cases) {
    CompressionSettings settings;
    settings.policy = c.policy;
    settings.output_shape = c.shape;
    settings.budget.by_fraction = true;
    settings.budget.keep_fraction = 0.2;
    settings.numerics = c.numerics;
    settings.seed = 9;
    auto policy_graphs = PrepareForRows(with_graphs, settings, window);
    auto policy_direct = PrepareForRows(without, settings, window);
    ASSERT_TRUE(policy_graphs.ok() && policy_direct.ok()) << c.policy;
    const std::string label = absl::StrCat(c.policy, " ", static_cast<int>(c.shape), " ",
                                           NumericsName(c.numerics));
    for (int round = 0; round < 4; ++round) {
      for (const ModelLayerData* data : {&a, &b}) {
        auto got = with_graphs.CompressLayer(*policy_graphs, request(*data), "layer");
        auto want = without.CompressLayer(*policy_direct, request(*data), "layer");
        ASSERT_TRUE(got.ok()) << label << ": " << got.status();
        ASSERT_TRUE(want.ok()) << label << ": " << want.status();
        EXPECT_EQ(got->offsets, want->offsets) << label << " round " << round;
        EXPECT_EQ(got->indices, want->indices) << label << " round " << round;
        EXPECT_EQ(got->perturbation, want->perturbation) << label << " round " << round;
        EXPECT_EQ(got->numerics, want->numerics) << label;
      }
    }
  }
  // Every layer after its first two sights came from a graph; none without graphs.
  const LaunchGraphStats on = graphs->launch_graph_stats();
  EXPECT_GT(on.replayed, 0);
  EXPECT_EQ(on.fallbacks, 0);
  EXPECT_EQ(direct->launch_graph_stats().replayed, 0);
  std::printf("launch graphs: %lld direct, %lld captured, %lld replayed\n",
              static_cast<long long>(on.direct), static_cast<long long>(on.captured),
              static_cast<long long>(on.replayed));
}

}  // namespace
}  // namespace kvtrim::gpu::testing
