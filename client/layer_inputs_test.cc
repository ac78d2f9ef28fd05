// Tests of the safetensors -> LayerInput conversion.
#include "client/layer_inputs.h"

#include <gtest/gtest.h>

namespace kvtrim {
namespace {

SafetensorsTensor F32(std::vector<int64_t> shape) {
  SafetensorsTensor t;
  t.shape = std::move(shape);
  t.data.assign(t.NumElements() * 4, '\0');
  return t;
}

TEST(LayerInputsTest, GroupsTensorsByLayerInIdOrder) {
  SafetensorsFile file;
  file.tensors["layer.10.keys"] = F32({2, 5, 4});
  file.tensors["layer.2.keys"] = F32({2, 5, 4});
  file.tensors["layer.2.values"] = F32({2, 5, 4});
  file.tensors["layer.2.queries"] = F32({4, 3, 4});
  file.tensors["embedding"] = F32({1});
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(file);
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 2u);
  EXPECT_EQ((*layers)[0].layer_id(), 2);
  EXPECT_EQ((*layers)[1].layer_id(), 10);
  EXPECT_TRUE((*layers)[0].has_values());
  EXPECT_TRUE((*layers)[0].has_queries());
  EXPECT_FALSE((*layers)[1].has_values());
  const v1::Tensor& q = (*layers)[0].queries();
  EXPECT_EQ(q.dtype(), v1::DTYPE_F32);
  EXPECT_EQ(std::vector<int64_t>(q.shape().begin(), q.shape().end()),
            (std::vector<int64_t>{4, 3, 4}));
  EXPECT_EQ(q.inline_data().size(), 4u * 3 * 4 * 4);
}

TEST(LayerInputsTest, MapsHalfDTypes) {
  SafetensorsTensor t = F32({1});
  t.dtype = DType::kBF16;
  t.data.resize(2);
  EXPECT_EQ(ToProtoTensor(t).dtype(), v1::DTYPE_BF16);
  t.dtype = DType::kF16;
  EXPECT_EQ(ToProtoTensor(t).dtype(), v1::DTYPE_F16);
}

TEST(LayerInputsTest, ValuesWithoutKeysIsAnError) {
  SafetensorsFile file;
  file.tensors["layer.3.values"] = F32({1, 1, 1});
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(file);
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layers.status().message().find("without layer.3.keys"), std::string::npos);
}

TEST(LayerInputsTest, BadIndexAndEmptyFile) {
  SafetensorsFile file;
  file.tensors["layer.-1.keys"] = F32({1, 1, 1});
  EXPECT_EQ(LayerInputsFromSafetensors(file).status().code(), absl::StatusCode::kInvalidArgument);
  file.tensors.clear();
  file.tensors["x"] = F32({1});
  EXPECT_EQ(LayerInputsFromSafetensors(file).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvtrim
