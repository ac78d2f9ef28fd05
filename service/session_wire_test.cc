// Tests of reading session messages from their wire bytes: tensor_chunk fields found in
// protobuf's encoding (split over any slices, fields in any order), everything else left
// to the full parse, and data copied exactly.
#include "service/session_wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/tensor_chunk_bytes.h"

namespace kvtrim::service {
namespace {

using ::kvtrim::testing::TensorChunkRequestBytes;

/// `bytes` as a ByteBuffer cut into slices at `cuts` (ascending offsets).
grpc::ByteBuffer Buffer(const std::string& bytes, std::vector<size_t> cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t start = 0;
  cuts.push_back(bytes.size());
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + start, cut - start);
    start = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

/// The bytes of varint `value`.
std::string Varint(uint64_t value) {
  std::string out;
  do {
    const uint8_t low = value & 0x7f;
    value >>= 7;
    out.push_back(static_cast<char>(value != 0 ? low | 0x80 : low));
  } while (value != 0);
  return out;
}

std::string Data(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 13 + 5);
  return data;
}

TEST(SessionWireTest, ChunkFieldsAndDataAreReadFromAnySlices) {
  const std::string data = Data(10000);
  const std::string bytes = TensorChunkRequestBytes(-3, v1::TENSOR_SLOT_QUERIES, 123456789, data);
  for (std::vector<size_t> cuts : std::vector<std::vector<size_t>>{
           {}, {1}, {2, 3, 4}, {20}, {bytes.size() - 1}, {7, 5000, 5001, 9000}}) {
    grpc::ByteBuffer buffer = Buffer(bytes, cuts);
    std::optional<WireTensorChunk> chunk = PeekTensorChunk(buffer);
    ASSERT_TRUE(chunk.has_value()) << cuts.size();
    EXPECT_EQ(chunk->layer_id, -3);
    EXPECT_EQ(chunk->slot, v1::TENSOR_SLOT_QUERIES);
    EXPECT_EQ(chunk->offset_bytes, 123456789u);
    ASSERT_EQ(chunk->data_bytes, 10000);
    std::string copied(data.size(), 'x');
    ASSERT_TRUE(CopyTensorChunkData(buffer, *chunk, copied.data()));
    EXPECT_EQ(copied, data);
  }
}

TEST(SessionWireTest, FieldsInAnyOrderAndDefaultsAreRead) {
  const std::string data = Data(300);
  // data, offset, slot, layer_id: the reverse of protobuf's order.
  std::string inner = std::string("\x22") + Varint(data.size()) + data;
  inner += std::string("\x18") + Varint(4096) + std::string("\x10\x02") + "\x08" + Varint(9);
  const std::string bytes = std::string("\x22") + Varint(inner.size()) + inner;
  v1::SessionRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));  // what protobuf makes of the same bytes
  grpc::ByteBuffer buffer = Buffer(bytes, {3});
  std::optional<WireTensorChunk> chunk = PeekTensorChunk(buffer);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(chunk->layer_id, parsed.tensor_chunk().layer_id());
  EXPECT_EQ(chunk->slot, parsed.tensor_chunk().slot());
  EXPECT_EQ(chunk->offset_bytes, parsed.tensor_chunk().offset_bytes());
  std::string copied(data.size(), 'x');
  ASSERT_TRUE(CopyTensorChunkData(buffer, *chunk, copied.data()));
  EXPECT_EQ(copied, parsed.tensor_chunk().data());
  // Layer 0, no slot, offset 0, no data: every field left out.
  grpc::ByteBuffer empty = Buffer(TensorChunkRequestBytes(0, v1::TENSOR_SLOT_UNSPECIFIED, 0, ""));
  chunk = PeekTensorChunk(empty);
  ASSERT_TRUE(chunk.has_value());
  EXPECT_EQ(chunk->layer_id, 0);
  EXPECT_EQ(chunk->slot, 0);
  EXPECT_EQ(chunk->data_bytes, 0);
}

TEST(SessionWireTest, AnythingElseIsLeftToTheFullParse) {
  const std::string chunk = TensorChunkRequestBytes(1, v1::TENSOR_SLOT_KEYS, 0, Data(50));
  v1::SessionRequest begin;
  begin.mutable_begin()->mutable_policy()->set_name("snapkv");
  v1::SessionRequest finish;
  finish.mutable_finish();
  const std::string inner = chunk.substr(2);  // the TensorChunk's own bytes
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"begin", begin.SerializeAsString()},
      {"finish", finish.SerializeAsString()},
      {"empty", ""},
      {"a chunk then finish (oneof: finish wins)", chunk + finish.SerializeAsString()},
      {"an unknown field in the chunk",
       std::string("\x22") + Varint(inner.size() + 2) + inner + "\x28\x01"},
      {"data twice", std::string("\x22") + Varint(inner.size() * 2) + inner + inner},
      {"slot as a length-delimited field",
       std::string("\x22") + Varint(inner.size() + 2) + inner + "\x12\x00"},
      {"truncated", chunk.substr(0, chunk.size() - 1)},
  };
  for (const auto& [name, bytes] : cases) {
    grpc::ByteBuffer buffer = Buffer(bytes);
    EXPECT_FALSE(PeekTensorChunk(buffer).has_value()) << name;
  }
}

TEST(SessionWireTest, UndecodableBytesNameSessionRequest) {
  grpc::ByteBuffer garbage = Buffer(std::string("\x22\xff\xff\xff\xff\x0f", 6));
  v1::SessionRequest request;
  const absl::Status status = ParseSessionRequest(garbage, &request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "SessionRequest: a message of 6 bytes is not a valid SessionRequest "
            "(undecodable protobuf)");
  v1::SessionRequest begin;
  begin.mutable_begin()->set_request_id("r1");
  grpc::ByteBuffer good = Buffer(begin.SerializeAsString(), {1});
  ASSERT_TRUE(ParseSessionRequest(good, &request).ok());
  EXPECT_EQ(request.begin().request_id(), "r1");
}

TEST(SessionWireTest, ResponsesSerialiseWhole) {
  v1::SessionResponse response;
  response.mutable_layer()->set_layer_id(4);
  response.mutable_layer()->add_indices(7);
  grpc::ByteBuffer buffer = SerializeSessionResponse(response);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size()),
            response.SerializeAsString());
}

}  // namespace
}  // namespace kvtrim::service
