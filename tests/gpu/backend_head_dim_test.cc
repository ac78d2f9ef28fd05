// GpuBackend serves layers whose head dimension exceeds the GPU kernels' limit (d > 256)
// on its CPU fallback, with the CPU backend's exact answer instead of an error.
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "tests/gpu/gpu_backend_for_tests.h"
#include "tests/testing/random_layer_test_util.h"
#include "kernels/registry.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

TEST(GpuBackendHeadDimTest, WideHeadsFallBackToTheCpuWithTheSameAnswer) {
  KVTRIM_SKIP_WITHOUT_GPU();
  auto gpu = testing::CreateGpuBackend();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend cpu(2);
  PolicyEngine cpu_engine(registry, cpu);
  PolicyEngine gpu_engine(registry, **gpu);
  for (const int64_t d : {int64_t{GpuBackend::kMaxGpuHeadDim}, int64_t{320}}) {
    RandomLayer layer(2, 300, d, 8, 32, 11);
    for (const char* name : {"dropkv", "snapkv", "keydiff"}) {
      CompressionSettings settings;
      settings.policy = name;
      settings.numerics = Numerics::kExact;  // bit parity with the CPU
      settings.budget.keep_fraction = 0.25;
      auto policy = cpu_engine.Prepare(settings, "settings");
      ASSERT_TRUE(policy.ok()) << policy.status();
      auto want = cpu_engine.CompressLayer(*policy, layer.request, "layer");
      auto got = gpu_engine.CompressLayer(*policy, layer.request, "layer");
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << name << " d=" << d << ": " << got.status();
      EXPECT_EQ(got->indices, want->indices) << name << " d=" << d;
      EXPECT_EQ(got->offsets, want->offsets) << name << " d=" << d;
    }
  }
  EXPECT_TRUE((*gpu)->healthy());
}

}  // namespace
}  // namespace kvtrim::gpu::testing
