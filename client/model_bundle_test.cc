// Model bundle files: write/read round trip and the errors naming the metadata key.
#include "client/model_bundle.h"

#include <gtest/gtest.h>

#include "tests/testing/model_bundle_fixture.h"
#include "tests/testing/test_dir.h"

namespace kvtrim {
namespace {

TEST(ModelBundleTest, WriteReadRoundTrip) {
  ModelInput input = testing::MakeTestModelInput(2, 4, 2, 8, 16, 3, true);
  testing::AddTestProfile(&input, "snapkv", "snapkv", 4, 32, 1);
  input.rope_theta = 500000.123456789;
  input.rope_scaling_json = R"({"rope_type":"llama3","factor":8.0})";
  const ModelBundle bundle = testing::BundleFromModelInput(input);
  const std::string path = kvtrim::testing::TestPath("bundle_roundtrip.safetensors");
  ASSERT_TRUE(WriteModelBundle(path, bundle).ok());
  absl::StatusOr<ModelBundle> read = ReadModelBundle(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header.SerializeAsString(), bundle.header.SerializeAsString());
  EXPECT_EQ(read->header.rope_theta(), 500000.123456789);  // exact
  ASSERT_EQ(read->weights.size(), bundle.weights.size());
  for (const auto& [name, tensor] : bundle.weights) {
    EXPECT_EQ(read->weights.at(name).data, tensor.data) << name;
    EXPECT_EQ(read->weights.at(name).shape, tensor.shape) << name;
  }
  EXPECT_EQ(read->manifests, bundle.manifests);
  EXPECT_EQ(read->WeightBytes(), bundle.WeightBytes());
  EXPECT_EQ(ToProtoDType(DType::kBF16), v1::DTYPE_BF16);
}

TEST(ModelBundleTest, ErrorsNameTheMetadataKey) {
  SafetensorsFile file = ModelBundleToSafetensors(testing::MakeTestModelBundle(1, 2, 1, 4, 8, 1, false));
  SafetensorsFile missing = file;
  missing.metadata.erase("num_kv_heads");
  EXPECT_EQ(ModelBundleFromSafetensors(missing, "m.safetensors").status().message(),
            "m.safetensors: __metadata__.num_kv_heads is missing (an integer)");
  SafetensorsFile bad = file;
  bad.metadata["head_dim"] = "eight";
  EXPECT_EQ(ModelBundleFromSafetensors(bad, "m").status().message(),
            "m: __metadata__.head_dim: 'eight' is not an integer");
  bad = file;
  bad.metadata["rope_theta"] = "";
  EXPECT_EQ(ModelBundleFromSafetensors(bad, "m").status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = file;
  bad.metadata["profile.x.manifest"] = "{}";
  EXPECT_EQ(ModelBundleFromSafetensors(bad, "m").status().message(),
            "m: __metadata__.profile.x.manifest: the file has no tensor \"profile.x\"");
  const std::string absent = kvtrim::testing::TestPath("no_such_bundle.safetensors");
  EXPECT_EQ(ReadModelBundle(absent).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtrim
