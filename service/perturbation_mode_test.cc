// settings.perturbation FULL / SAMPLED / OFF through kvtrimd on the CPU backend: FULL and
// SAMPLED answer the same statistic over every window row (the CPU computes exact numerics
// only; SAMPLED differs in fast numerics on the GPU: tests/gpu/fast_perturbation_test.cc),
// LayerResult.perturbation_rows says how many rows it averaged, OFF computes nothing, and the
// perturbation histogram counts the observations under rows="all".
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

/// The per-head perturbations of every layer of `response`.
std::vector<double> Perturbations(const v1::CompressResponse& response) {
  std::vector<double> out;
  for (const v1::LayerResult& layer : response.layers()) {
    for (const v1::HeadStats& head : layer.heads()) {
      if (head.has_perturbation()) out.push_back(head.perturbation());
    }
  }
  return out;
}

TEST(PerturbationModeRpc, FullSampledAndOffOnTheCpuBackend) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  LayerDims dims;  // w = 32 window rows
  v1::CompressRequest request = MakeRequest("dropkv", 2, dims);
  v1::CompressResponse full, sampled, off;
  request.mutable_settings()->set_perturbation(v1::PERTURBATION_FULL);
  ASSERT_TRUE(CallCompress(*stub, request, &full).ok());
  request.mutable_settings()->set_perturbation(v1::PERTURBATION_SAMPLED);
  ASSERT_TRUE(CallCompress(*stub, request, &sampled).ok());
  request.mutable_settings()->set_perturbation(v1::PERTURBATION_OFF);
  ASSERT_TRUE(CallCompress(*stub, request, &off).ok());

  EXPECT_EQ(Perturbations(full).size(), static_cast<size_t>(2 * dims.kv_heads));
  EXPECT_EQ(Perturbations(sampled), Perturbations(full));
  EXPECT_TRUE(Perturbations(off).empty());
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(full.layers(l).perturbation_rows(), dims.window);
    EXPECT_EQ(sampled.layers(l).perturbation_rows(), dims.window);  // exact: every row
    EXPECT_EQ(off.layers(l).perturbation_rows(), 0);
  }
  // Two requests with the statistic, two layers of H_kv heads each: all of them exact.
  EXPECT_EQ(HistogramCount(*server, "kvtrim_perturbation_ratio",
                           {{"policy", "dropkv"}, {"rows", "all"}}),
            static_cast<uint64_t>(2 * 2 * dims.kv_heads));
  EXPECT_EQ(HistogramCount(*server, "kvtrim_perturbation_ratio",
                           {{"policy", "dropkv"}, {"rows", "sampled"}}),
            0u);
}

}  // namespace
}  // namespace kvtrim::service::testing
