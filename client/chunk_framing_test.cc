// Tests of the hand-framed tensor_chunk messages: the same bytes as protobuf's encoding,
// independent of the caller's memory once framed.
#include "client/chunk_framing.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/tensor_chunk_bytes.h"

namespace kvtrim {
namespace {

using ::kvtrim::testing::TensorChunkRequestBytes;

/// The bytes of `buffer`, concatenated.
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

TEST(ChunkFramingTest, FramedChunksAreProtobufsBytes) {
  for (int32_t layer_id : {0, 1, 31, -7, 2147483647}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{4096}, uint64_t{1} << 40}) {
      for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{70000}}) {
        std::string data(size, '\0');
        for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 7 + layer_id);
        const grpc::ByteBuffer framed = FrameTensorChunk(
            layer_id, v1::TENSOR_SLOT_VALUES, offset, data.data(), data.size());
        EXPECT_EQ(Bytes(framed),
                  TensorChunkRequestBytes(layer_id, v1::TENSOR_SLOT_VALUES, offset, data))
            << "layer " << layer_id << " offset " << offset << " size " << size;
      }
    }
  }
}

TEST(ChunkFramingTest, TheDataIsCopiedOnce) {
  std::string data(300, 'a');
  const grpc::ByteBuffer framed =
      FrameTensorChunk(1, v1::TENSOR_SLOT_QUERIES, 8, data.data(), data.size());
  const std::string expected = TensorChunkRequestBytes(1, v1::TENSOR_SLOT_QUERIES, 8, data);
  data.assign(data.size(), 'z');  // the caller's memory is free once framed
  EXPECT_EQ(Bytes(framed), expected);
}

TEST(ChunkFramingTest, MessagesSerialiseWhole) {
  v1::SessionRequest request;
  request.mutable_begin()->mutable_policy()->set_name("snapkv");
  EXPECT_EQ(Bytes(SerializeToByteBuffer(request)), request.SerializeAsString());
}

}  // namespace
}  // namespace kvtrim
