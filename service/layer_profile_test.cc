// Per-stage layer profiles (settings.profile, LayerResult.profile) on the CPU backend: absent
// unless asked for, the same kept lists either way, the backend's host stages filled, the
// GPU-only stages zero, and every stage of a layer inside its server time, unary and in
// sessions (the GPU backend's device stages: tests/gpu/layer_profile_test.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

/// Expects the CPU backend's profile of one layer of a request with values and queries:
/// host-timed scoring, selection and perturbation, zero GPU stages, and `inside` (the stages
/// that lie within the server time) summing to at most the server time.
void ExpectCpuProfile(const v1::LayerProfile& p, double inside, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_GT(p.server_seconds(), 0.0);
  EXPECT_GT(p.score_seconds(), 0.0);
  EXPECT_GT(p.select_seconds(), 0.0);
  EXPECT_GT(p.perturbation_seconds(), 0.0);
  EXPECT_GT(p.encode_seconds(), 0.0);
  EXPECT_GE(p.decode_seconds(), 0.0);
  EXPECT_GE(p.validate_seconds(), 0.0);
  for (double gpu_only : {p.worker_wait_seconds(), p.plan_seconds(), p.stage_seconds(),
                          p.ready_wait_seconds(), p.stage_device_seconds(),
                          p.download_seconds(), p.fetch_seconds()}) {
    EXPECT_EQ(gpu_only, 0.0);
  }
  EXPECT_LE(inside, p.server_seconds());
}

TEST(LayerProfileRpc, UnaryAnswersCarryTheProfileOnlyWhenAsked) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  v1::CompressRequest request = MakeRequest("dropkv", 3);
  v1::CompressResponse plain, profiled;
  ASSERT_TRUE(CallCompress(*stub, request, &plain).ok());
  request.mutable_settings()->set_profile(true);
  const grpc::Status st = CallCompress(*stub, request, &profiled);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(profiled.layers_size(), 3);
  for (int l = 0; l < 3; ++l) {
    EXPECT_FALSE(plain.layers(l).has_profile());
    ASSERT_TRUE(profiled.layers(l).has_profile());
    EXPECT_EQ(std::vector<int32_t>(profiled.layers(l).indices().begin(),
                                   profiled.layers(l).indices().end()),
              std::vector<int32_t>(plain.layers(l).indices().begin(),
                                   plain.layers(l).indices().end()));
    const v1::LayerProfile& p = profiled.layers(l).profile();
    // A unary layer's server time runs from the handler's start to its answer encoded.
    const double inside = p.decode_seconds() + p.validate_seconds() + p.score_seconds() +
                          p.select_seconds() + p.perturbation_seconds() + p.encode_seconds();
    ExpectCpuProfile(p, inside, "layer " + std::to_string(l));
  }
  // Later layers were encoded later: their server times do not shrink.
  EXPECT_LE(profiled.layers(0).profile().server_seconds(),
            profiled.layers(2).profile().server_seconds());
}

TEST(LayerProfileRpc, SessionLayersCarryTheProfile) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  v1::CompressRequest request = MakeRequest("dropkv", 3);
  request.mutable_settings()->set_profile(true);
  std::vector<v1::SessionResponse> responses;
  const grpc::Status st = CallSession(*stub, request, true, &responses);
  ASSERT_TRUE(st.ok()) << st.error_message();
  int layers = 0;
  for (const v1::SessionResponse& response : responses) {
    if (!response.has_layer()) continue;
    ++layers;
    ASSERT_TRUE(response.layer().has_profile());
    const v1::LayerProfile& p = response.layer().profile();
    // From the layer message read to its answer encoded: decoded, validated, queued,
    // computed, encoded.
    const double inside = p.decode_seconds() + p.validate_seconds() + p.queued_seconds() +
                          p.score_seconds() + p.select_seconds() + p.perturbation_seconds() +
                          p.encode_seconds();
    ExpectCpuProfile(p, inside, "layer " + std::to_string(response.layer().layer_id()));
  }
  EXPECT_EQ(layers, 3);
}

}  // namespace
}  // namespace kvtrim::service::testing
