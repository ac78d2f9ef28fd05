// The GPU backend's per-stage layer profile (CompressionSettings::profile, LayerProfile): the
// device stages timed by the worker's StageEvents, for host and device-resident inputs, for a
// layer decided by EnqueueLayer and one decided by EnqueueDecision, launched one by one and
// replayed from a launch graph; the same kept lists with and without it, and nothing filled
// when it is off. Skips without a GPU.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/model_test_data.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr int64_t kHeads = 2, kGroup = 4, kTokens = 3000, kDim = 64, kWindow = 16;
constexpr DType kType = DType::kBF16;

/// The layer of `data`, its tensors at `keys` / `values` / `queries` in `space`.
LayerRequest RequestOf(const void* keys, const void* values, const void* queries,
                       MemorySpace space) {
  LayerRequest layer;
  layer.keys = {keys, kType, {kHeads, kTokens, kDim}};
  layer.values = {values, kType, {kHeads, kTokens, kDim}};
  layer.queries = {queries, kType, {kHeads * kGroup, kWindow, kDim}};
  layer.keys.space = layer.values.space = layer.queries.space = space;
  return layer;
}

/// Expects every stage a profiled GPU layer passes to be timed (the device staging only with
/// host inputs, which are uploaded; device inputs are read in place).
void ExpectTimed(const LayerProfile& p, bool host_inputs, const std::string& label) {
  SCOPED_TRACE(label);
  EXPECT_GT(p.plan, 0.0);
  EXPECT_GT(p.stage, 0.0);
  if (host_inputs) EXPECT_GT(p.stage_device, 0.0);
  EXPECT_GE(p.stage_device, 0.0);
  EXPECT_GT(p.score, 0.0);
  EXPECT_GT(p.select, 0.0);
  EXPECT_GT(p.perturbation, 0.0);
  EXPECT_GT(p.download, 0.0);
  EXPECT_GT(p.fetch, 0.0);
  EXPECT_GE(p.ready_wait, 0.0);
  EXPECT_GE(p.worker_wait, 0.0);
  // The device stages after the inputs ran inside the host's enqueue + fetch.
  EXPECT_LE(p.score + p.select + p.perturbation + p.download, p.fetch + 1e-4);
}

/// Compresses `layer` with `settings` (profile off, then on) on `backend` `rounds` times each:
/// equal lists, zero profiles off, timed ones on.
void ExpectProfiled(GpuBackend& backend, CompressionSettings settings, const LayerRequest& layer,
                    int rounds, const std::string& label) {
  PolicyEngine engine(BuiltinRegistry(), backend);
  settings.profile = false;
  auto plain_policy = PrepareForRows(engine, settings, kWindow);
  settings.profile = true;
  auto profiled_policy = PrepareForRows(engine, settings, kWindow);
  ASSERT_TRUE(plain_policy.ok() && profiled_policy.ok()) << label;
  for (int round = 0; round < rounds; ++round) {
    const std::string where = absl::StrCat(label, " round ", round);
    auto plain = engine.CompressLayer(*plain_policy, layer, "layer");
    auto profiled = engine.CompressLayer(*profiled_policy, layer, "layer");
    ASSERT_TRUE(plain.ok()) << where << ": " << plain.status();
    ASSERT_TRUE(profiled.ok()) << where << ": " << profiled.status();
    EXPECT_EQ(profiled->indices, plain->indices) << where;
    EXPECT_EQ(profiled->offsets, plain->offsets) << where;
    EXPECT_EQ(plain->profile.score, 0.0) << where;
    EXPECT_EQ(plain->profile.fetch, 0.0) << where;
    ExpectTimed(profiled->profile, layer.keys.space == MemorySpace::kHost, where);
  }
}

/// DropKV (fused selection) and SnapKV with equal counts (decided on the device).
std::vector<CompressionSettings> Cases() {
  std::vector<CompressionSettings> cases(2);
  cases[0].policy = "dropkv";
  cases[1].policy = "snapkv";
  cases[1].output_shape = OutputShape::kEqualCount;
  for (CompressionSettings& s : cases) {
    s.budget.by_fraction = true;
    s.budget.keep_fraction = 0.2;
    s.numerics = Numerics::kFast;
  }
  return cases;
}

TEST(LayerProfileGpu, HostInputsDirectAndReplayed) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const ModelLayerData data = MakeModelLayerData(kType, kHeads, kTokens, kDim, kGroup, kWindow, 5);
  const LayerRequest layer = RequestOf(data.keys.data(), data.values.data(), data.queries.data(),
                                       MemorySpace::kHost);
  for (size_t graphs : {size_t{0}, size_t{16}}) {
    std::unique_ptr<GpuBackend> backend = OneWorkerBackend(graphs);
    ASSERT_NE(backend, nullptr);
    for (const CompressionSettings& settings : Cases()) {
      ExpectProfiled(*backend, settings, layer, 4,
                     absl::StrCat(settings.policy, " graphs=", graphs));
    }
    if (graphs > 0) EXPECT_GT(backend->launch_graph_stats().replayed, 0);
  }
}

TEST(LayerProfileGpu, DeviceInputs) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const ModelLayerData data = MakeModelLayerData(kType, kHeads, kTokens, kDim, kGroup, kWindow, 6);
  DeviceBuffer keys(data.keys.size()), values(data.values.size()), queries(data.queries.size());
  ASSERT_EQ(cudaMemcpy(keys.get(), data.keys.data(), data.keys.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(values.get(), data.values.data(), data.values.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(queries.get(), data.queries.data(), data.queries.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  const LayerRequest layer =
      RequestOf(keys.get(), values.get(), queries.get(), MemorySpace::kDevice);
  std::unique_ptr<GpuBackend> backend = OneWorkerBackend(0);
  ASSERT_NE(backend, nullptr);
  for (const CompressionSettings& settings : Cases()) {
    ExpectProfiled(*backend, settings, layer, 2, absl::StrCat(settings.policy, " device"));
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing
