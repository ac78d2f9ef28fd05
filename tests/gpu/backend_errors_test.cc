// GpuBackend error mapping: no device, arena caps and real device out-of-memory become
// RESOURCE_EXHAUSTED with the backend still usable afterwards; a sticky CUDA error turns
// the backend unhealthy (design.md convention 9).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/registry.h"
#include "tests/gpu/fault_injection.h"
#include "tests/gpu/gpu_backend_for_tests.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

using ::testing::HasSubstr;

/// Deterministic values in [-1, 1).
std::vector<float> Values(size_t count, uint64_t seed) {
  std::vector<float> out(count);
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(static_cast<double>(state >> 40) / 16777216.0) * 2.0f - 1.0f;
  }
  return out;
}

/// A registry, a resolved knorm policy and an f32 keys-only layer [3, n, d].
struct KnormLayer {
  PolicyRegistry registry;
  std::vector<float> keys;
  LayerRequest request;

  KnormLayer(int64_t n, int64_t d) : keys(Values(static_cast<size_t>(3 * n * d), 5)) {
    RegisterBuiltinPolicies(&registry);
    request.keys = {keys.data(), DType::kF32, {3, n, d}};
  }
  CompressionSettings Settings() const {
    CompressionSettings s;
    s.policy = "knorm";
    s.budget.keep_fraction = 0.3;
    return s;
  }
};

/// Compresses `layer` on `backend` and on the CPU; expects identical answers.
void ExpectMatchesCpu(Backend& backend, KnormLayer& layer) {
  CpuBackend cpu(1);
  PolicyEngine cpu_engine(layer.registry, cpu);
  PolicyEngine gpu_engine(layer.registry, backend);
  auto policy = cpu_engine.Prepare(layer.Settings(), "settings");
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto want = cpu_engine.CompressLayer(*policy, layer.request, "layer");
  auto got = gpu_engine.CompressLayer(*policy, layer.request, "layer");
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->offsets, want->offsets);
  EXPECT_EQ(got->indices, want->indices);
}

TEST(GpuBackendCreateTest, WithoutGpuIsFailedPrecondition) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present; this test covers machines without one";
  auto backend = testing::CreateGpuBackend();
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("no CUDA device is visible"));
}

TEST(GpuBackendCreateTest, MissingOrdinalIsFailedPrecondition) {
  KVTRIM_SKIP_WITHOUT_GPU();
  GpuBackendOptions options;
  options.device = 4096;
  auto backend = testing::CreateGpuBackend(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("device 4096 does not exist"));
}

TEST(GpuBackendCreateTest, ZeroWorkersIsInvalidArgument) {
  KVTRIM_SKIP_WITHOUT_GPU();
  GpuBackendOptions options;
  options.workers = 0;
  auto backend = testing::CreateGpuBackend(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("at least one worker"));
}

TEST(GpuBackendMemoryTest, ArenaCapIsResourceExhaustedAndBackendRecovers) {
  KVTRIM_SKIP_WITHOUT_GPU();
  GpuBackendOptions options;
  options.workers = 1;
  options.arena_limit_bytes = size_t{1} << 20;  // 1 MiB
  auto backend = testing::CreateGpuBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();

  KnormLayer big(40000, 128);  // keys alone: 3 x 40000 x 128 x 4 B = 61 MB
  PolicyEngine engine(big.registry, **backend);
  auto policy = engine.Prepare(big.Settings(), "settings");
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto refused = engine.CompressLayer(*policy, big.request, "layer");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("at most 1048576"));
  EXPECT_TRUE((*backend)->healthy());

  KnormLayer small(99, 64);
  ExpectMatchesCpu(**backend, small);
  EXPECT_TRUE((*backend)->healthy());
}

TEST(GpuBackendMemoryTest, DeviceOutOfMemoryIsResourceExhaustedAndBackendRecovers) {
  KVTRIM_SKIP_WITHOUT_GPU();
  GpuBackendOptions options;
  options.workers = 2;
  auto backend = testing::CreateGpuBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();

  // A validated layer of 64 x 4M x 256 f32 keys = 256 GiB: more than any GPU holds, so
  // the arena's cudaMalloc fails before a byte is uploaded (the data pointer is a stand-in
  // that is never read; d stays within the GPU kernels' limit so no CPU fallback runs).
  KnormLayer small(99, 64);
  PolicyEngine engine(small.registry, **backend);
  auto policy = engine.Prepare(small.Settings(), "settings");
  ASSERT_TRUE(policy.ok()) << policy.status();
  ValidatedLayer huge;
  huge.shape.num_kv_heads = 64;
  huge.shape.num_tokens = int64_t{4} << 20;
  huge.shape.head_dim = GpuBackend::kMaxGpuHeadDim;
  huge.keys = {small.keys.data(), DType::kF32, {64, int64_t{4} << 20, GpuBackend::kMaxGpuHeadDim}};
  huge.softmax_scale = 1.0f / 16.0f;
  LayerBudget budget;
  budget.kept_per_head = KeptCount(policy->settings.budget, huge.shape.num_tokens);
  LayerDecision decision;
  const absl::Status st = (*backend)->CompressLayer(*policy, huge, budget, &decision);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("cudaErrorMemoryAllocation"));
  EXPECT_EQ(CudaErrorOf(st), cudaErrorMemoryAllocation);
  EXPECT_TRUE((*backend)->healthy());

  ExpectMatchesCpu(**backend, small);
  EXPECT_TRUE((*backend)->healthy());
}

/// Child-process body of the sticky-error test: exits 0 after printing STICKY_OK when the
/// backend behaved, 1 with a reason otherwise.
void StickyErrorScenario() {
  GpuBackendOptions options;
  options.workers = 1;
  auto backend = testing::CreateGpuBackend(options);
  if (!backend.ok()) {
    std::fprintf(stderr, "create failed: %s\n", backend.status().ToString().c_str());
    std::exit(1);
  }
  KnormLayer layer(99, 64);
  PolicyEngine engine(layer.registry, **backend);
  auto policy = engine.Prepare(layer.Settings(), "settings");
  if (!policy.ok() || !engine.CompressLayer(*policy, layer.request, "layer").ok()) {
    std::fprintf(stderr, "the first compression failed\n");
    std::exit(1);
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) std::exit(1);
  const cudaError_t fault = InjectStickyFault(stream);
  if (!IsStickyCudaError(fault)) {
    std::fprintf(stderr, "the injected fault was %s, not sticky\n", cudaGetErrorName(fault));
    std::exit(1);
  }
  auto failed = engine.CompressLayer(*policy, layer.request, "layer");
  if (failed.ok() || failed.status().code() != absl::StatusCode::kInternal) {
    std::fprintf(stderr, "after the fault: %s\n", failed.status().ToString().c_str());
    std::exit(1);
  }
  if ((*backend)->healthy() || (*backend)->failure().empty()) {
    std::fprintf(stderr, "the backend still reports healthy\n");
    std::exit(1);
  }
  auto refused = engine.CompressLayer(*policy, layer.request, "layer");
  if (refused.ok() || refused.status().code() != absl::StatusCode::kInternal ||
      std::string(refused.status().message()).find("must be restarted") == std::string::npos) {
    std::fprintf(stderr, "the unhealthy backend answered: %s\n",
                 refused.status().ToString().c_str());
    std::exit(1);
  }
  std::fprintf(stderr, "STICKY_OK %s\n", failed.status().ToString().c_str());
  std::exit(0);
}

// Runs in a re-executed child (death-test style "threadsafe"): the fault ruins the CUDA
// context of the process that injects it. Not for compute-sanitizer runs (the fault is an
// intended illegal address).
TEST(GpuBackendStickyTest, StickyErrorMarksBackendUnhealthy) {
  KVTRIM_SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(StickyErrorScenario(), ::testing::ExitedWithCode(0), "STICKY_OK");
}

}  // namespace
}  // namespace kvtrim::gpu::testing
