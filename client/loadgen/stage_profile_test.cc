// StageProfile: the stages in order, samples per layer, the time outside the server, merging
// and the JSON / table forms.
#include "client/loadgen/stage_profile.h"

#include <gtest/gtest.h>

namespace kvtrim::loadgen {
namespace {

/// The samples of stage `name` (fails the test when it is missing).
const std::vector<double>& SamplesOf(const StageProfile& profile, const std::string& name) {
  for (const StageSamples& stage : profile.stages()) {
    if (stage.name == name) return stage.seconds;
  }
  ADD_FAILURE() << "no stage " << name;
  static const std::vector<double> kNone;
  return kNone;
}

TEST(StageProfile, CollectsEveryStageAndTheTimeOutsideTheServer) {
  StageProfile profile;
  EXPECT_EQ(profile.layers(), 0u);
  v1::LayerProfile layer;
  layer.set_server_seconds(0.004);
  layer.set_decode_seconds(0.001);
  layer.set_score_seconds(0.002);
  layer.set_download_seconds(0.0001);
  profile.Add(layer, 0.005);
  layer.set_server_seconds(0.006);
  profile.Add(layer, 0.005);  // a round trip below the server time counts as 0 outside
  ASSERT_EQ(profile.layers(), 2u);
  EXPECT_EQ(profile.stages().front().name, "decode");
  EXPECT_EQ(profile.stages().back().name, "outside_server");
  EXPECT_EQ(SamplesOf(profile, "score"), (std::vector<double>{0.002, 0.002}));
  EXPECT_EQ(SamplesOf(profile, "select"), (std::vector<double>{0.0, 0.0}));
  const std::vector<double>& outside = SamplesOf(profile, "outside_server");
  ASSERT_EQ(outside.size(), 2u);
  EXPECT_NEAR(outside[0], 0.001, 1e-12);
  EXPECT_EQ(outside[1], 0.0);

  StageProfile more;
  more.Add(layer, 0.01);
  profile.Merge(more);
  EXPECT_EQ(profile.layers(), 3u);
  EXPECT_NEAR(SamplesOf(profile, "outside_server")[2], 0.004, 1e-12);

  const nlohmann::json json = profile.Json();
  EXPECT_EQ(json["order"].size(), profile.stages().size());
  EXPECT_EQ(json["stages"]["score"]["count"], 3);
  EXPECT_DOUBLE_EQ(json["stages"]["score"]["p50"].get<double>(), 0.002);
  EXPECT_EQ(json["stages"]["download"]["where"], "device");
  EXPECT_NE(profile.Table().find("outside_server"), std::string::npos);
}

}  // namespace
}  // namespace kvtrim::loadgen
