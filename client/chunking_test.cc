// Tests of SplitLayer: which tensors are chunked, message order, chunk sizes and offsets,
// and that the chunks reassemble to the original bytes.
#include "client/chunking.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace kvtrim {
namespace {

/// `bytes` distinct-ish bytes (a position pattern) so that misplaced chunks show.
std::string Pattern(size_t bytes, int salt) {
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 31 + salt) & 0xff);
  return data;
}

/// A layer with inline keys / values / queries of the given byte sizes (0 = absent).
v1::LayerInput Layer(int32_t id, size_t keys, size_t values, size_t queries) {
  v1::LayerInput layer;
  layer.set_layer_id(id);
  layer.set_softmax_scale(0.5f);
  auto fill = [](v1::Tensor* tensor, size_t bytes, int salt) {
    tensor->set_dtype(v1::DTYPE_BF16);
    tensor->add_shape(1);
    tensor->add_shape(static_cast<int64_t>(bytes / 2));
    tensor->add_shape(1);
    tensor->set_inline_data(Pattern(bytes, salt));
  };
  fill(layer.mutable_keys(), keys, 1);
  if (values > 0) fill(layer.mutable_values(), values, 2);
  if (queries > 0) fill(layer.mutable_queries(), queries, 3);
  return layer;
}

/// The tensor bytes the chunks of `messages` (after the first) carry, by slot; checks
/// the chunks' layer id, contiguity and size cap on the way.
std::map<int, std::string> Reassemble(const std::vector<v1::SessionRequest>& messages,
                                      int32_t layer_id, int64_t chunk_bytes) {
  std::map<int, std::string> out;
  for (size_t i = 1; i < messages.size(); ++i) {
    EXPECT_TRUE(messages[i].has_tensor_chunk()) << i;
    const v1::TensorChunk& chunk = messages[i].tensor_chunk();
    EXPECT_EQ(chunk.layer_id(), layer_id);
    EXPECT_LE(static_cast<int64_t>(chunk.data().size()), chunk_bytes);
    EXPECT_GT(chunk.data().size(), 0u);
    std::string& bytes = out[chunk.slot()];
    EXPECT_EQ(chunk.offset_bytes(), bytes.size()) << "chunk " << i << " is not contiguous";
    bytes += chunk.data();
  }
  return out;
}

TEST(SplitLayerTest, NonPositiveChunkBytesNeverSplits) {
  for (int64_t chunk_bytes : {int64_t{0}, int64_t{-5}}) {
    const v1::LayerInput layer = Layer(3, 1000, 1000, 100);
    std::vector<v1::SessionRequest> messages = SplitLayer(layer, chunk_bytes);
    ASSERT_EQ(messages.size(), 1u);
    ASSERT_TRUE(messages[0].has_layer());
    EXPECT_EQ(messages[0].layer().SerializeAsString(), layer.SerializeAsString());
  }
}

TEST(SplitLayerTest, SmallTensorsStayInline) {
  const v1::LayerInput layer = Layer(1, 64, 64, 32);
  std::vector<v1::SessionRequest> messages = SplitLayer(layer, 64);  // equal: not larger
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].layer().SerializeAsString(), layer.SerializeAsString());
}

TEST(SplitLayerTest, LargeTensorsAreChunkedInOrderAndReassemble) {
  const v1::LayerInput original = Layer(7, 1000, 999, 40);
  const int64_t chunk_bytes = 256;
  std::vector<v1::SessionRequest> messages = SplitLayer(original, chunk_bytes);
  // keys: 4 chunks (256 * 3 + 232), values: 4 (256 * 3 + 231), queries stay inline.
  ASSERT_EQ(messages.size(), 1u + 4 + 4);
  ASSERT_TRUE(messages[0].has_layer());
  const v1::LayerInput& head = messages[0].layer();
  EXPECT_EQ(head.layer_id(), 7);
  EXPECT_FLOAT_EQ(head.softmax_scale(), 0.5f);
  ASSERT_EQ(head.keys().data_case(), v1::Tensor::kChunked);
  EXPECT_EQ(head.keys().chunked().total_bytes(), 1000u);
  EXPECT_EQ(head.keys().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(head.keys().shape_size(), 3);
  ASSERT_EQ(head.values().data_case(), v1::Tensor::kChunked);
  EXPECT_EQ(head.values().chunked().total_bytes(), 999u);
  ASSERT_EQ(head.queries().data_case(), v1::Tensor::kInlineData);
  EXPECT_EQ(head.queries().inline_data(), original.queries().inline_data());

  // Keys' chunks first, then values'.
  for (size_t i = 1; i <= 4; ++i)
    EXPECT_EQ(messages[i].tensor_chunk().slot(), v1::TENSOR_SLOT_KEYS);
  for (size_t i = 5; i <= 8; ++i) {
    EXPECT_EQ(messages[i].tensor_chunk().slot(), v1::TENSOR_SLOT_VALUES);
  }
  EXPECT_EQ(messages[4].tensor_chunk().data().size(), 1000u - 3 * 256);
  std::map<int, std::string> bytes = Reassemble(messages, 7, chunk_bytes);
  EXPECT_EQ(bytes[v1::TENSOR_SLOT_KEYS], original.keys().inline_data());
  EXPECT_EQ(bytes[v1::TENSOR_SLOT_VALUES], original.values().inline_data());
  EXPECT_EQ(bytes.count(v1::TENSOR_SLOT_QUERIES), 0u);
}

TEST(SplitLayerTest, EveryTensorChunkedKeysValuesQueries) {
  const v1::LayerInput original = Layer(0, 300, 300, 300);
  std::vector<v1::SessionRequest> messages = SplitLayer(original, 100);
  ASSERT_EQ(messages.size(), 10u);
  const v1::TensorSlot expected[] = {
      v1::TENSOR_SLOT_KEYS,    v1::TENSOR_SLOT_KEYS,    v1::TENSOR_SLOT_KEYS,
      v1::TENSOR_SLOT_VALUES,  v1::TENSOR_SLOT_VALUES,  v1::TENSOR_SLOT_VALUES,
      v1::TENSOR_SLOT_QUERIES, v1::TENSOR_SLOT_QUERIES, v1::TENSOR_SLOT_QUERIES};
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(messages[i + 1].tensor_chunk().slot(), expected[i]) << i;
    EXPECT_EQ(messages[i + 1].tensor_chunk().offset_bytes(), (i % 3) * 100) << i;
    EXPECT_EQ(messages[i + 1].tensor_chunk().data().size(), 100u) << i;
  }
  std::map<int, std::string> bytes = Reassemble(messages, 0, 100);
  EXPECT_EQ(bytes[v1::TENSOR_SLOT_KEYS], original.keys().inline_data());
  EXPECT_EQ(bytes[v1::TENSOR_SLOT_VALUES], original.values().inline_data());
  EXPECT_EQ(bytes[v1::TENSOR_SLOT_QUERIES], original.queries().inline_data());
  EXPECT_EQ(messages[0].layer().queries().chunked().total_bytes(), 300u);
}

TEST(SplitLayerTest, RegionTensorsAreNotTouched) {
  v1::LayerInput layer;
  layer.set_layer_id(2);
  layer.mutable_keys()->mutable_host_shm()->set_region_id("r1");
  layer.mutable_keys()->mutable_host_shm()->set_offset_bytes(4096);
  std::vector<v1::SessionRequest> messages = SplitLayer(layer, 1);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].layer().SerializeAsString(), layer.SerializeAsString());
  EXPECT_EQ(InlineTensorBytes(layer), 0);
}

TEST(SplitLayerTest, InlineTensorBytesSumsInlineData) {
  EXPECT_EQ(InlineTensorBytes(Layer(0, 10, 20, 6)), 36);
  EXPECT_EQ(InlineTensorBytes(Layer(0, 10, 0, 0)), 10);
}

}  // namespace
}  // namespace kvtrim
