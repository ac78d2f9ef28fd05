// settings.perturbation FULL / SAMPLED / OFF through kvtrimd on the CPU backend: in fast
// numerics SAMPLED averages the last 8 window rows of each query head (FULL every row), in
// exact numerics both answer the statistic over every window row;
// LayerResult.perturbation_rows says how many rows it averaged, OFF computes nothing, and the
// perturbation histogram counts the observations under rows="all" or "sampled".
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/layer.h"
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
  for (const v1::Numerics numerics : {v1::NUMERICS_FAST, v1::NUMERICS_EXACT}) {
    SCOPED_TRACE(v1::Numerics_Name(numerics));
    const bool fast = numerics == v1::NUMERICS_FAST;
    v1::CompressRequest request = MakeRequest("dropkv", 2, dims);
    request.mutable_settings()->set_numerics(numerics);
    v1::CompressResponse full, sampled, off;
    request.mutable_settings()->set_perturbation(v1::PERTURBATION_FULL);
    ASSERT_TRUE(CallCompress(*stub, request, &full).ok());
    request.mutable_settings()->set_perturbation(v1::PERTURBATION_SAMPLED);
    ASSERT_TRUE(CallCompress(*stub, request, &sampled).ok());
    request.mutable_settings()->set_perturbation(v1::PERTURBATION_OFF);
    ASSERT_TRUE(CallCompress(*stub, request, &off).ok());

    EXPECT_EQ(Perturbations(full).size(), static_cast<size_t>(2 * dims.kv_heads));
    EXPECT_EQ(Perturbations(sampled).size(), static_cast<size_t>(2 * dims.kv_heads));
    // Exact numerics average every row whatever was asked; fast ones the last 8 when
    // sampled (another mean, on these random layers never the same number).
    if (fast) {
      EXPECT_NE(Perturbations(sampled), Perturbations(full));
    } else {
      EXPECT_EQ(Perturbations(sampled), Perturbations(full));
    }
    EXPECT_TRUE(Perturbations(off).empty());
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(full.layers(l).perturbation_rows(), dims.window);
      EXPECT_EQ(sampled.layers(l).perturbation_rows(),
                fast ? kSampledPerturbationRows : dims.window);
      EXPECT_EQ(off.layers(l).perturbation_rows(), 0);
    }
  }
  // Fast: full and sampled, two layers of H_kv heads each; exact: both requests every row.
  EXPECT_EQ(HistogramCount(*server, "kvtrim_perturbation_ratio",
                           {{"policy", "dropkv"}, {"rows", "all"}}),
            static_cast<uint64_t>(3 * 2 * dims.kv_heads));
  EXPECT_EQ(HistogramCount(*server, "kvtrim_perturbation_ratio",
                           {{"policy", "dropkv"}, {"rows", "sampled"}}),
            static_cast<uint64_t>(2 * dims.kv_heads));
}

}  // namespace
}  // namespace kvtrim::service::testing
