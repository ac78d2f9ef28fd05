#include "client/chunk_framing.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <cstring>
#include <string>

namespace kvtrim {
namespace {

using google::protobuf::io::CodedOutputStream;
using google::protobuf::internal::WireFormatLite;

constexpr int kSessionTensorChunkField = v1::SessionRequest::kTensorChunkFieldNumber;
constexpr int kChunkDataField = v1::TensorChunk::kDataFieldNumber;

/// Appends `value` as a varint.
void AppendVarint(uint64_t value, std::string* out) {
  uint8_t bytes[10];
  uint8_t* end = CodedOutputStream::WriteVarint64ToArray(value, bytes);
  out->append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(end - bytes));
}

/// Appends the tag of field `field` with `type`.
void AppendTag(int field, WireFormatLite::WireType type, std::string* out) {
  AppendVarint(WireFormatLite::MakeTag(field, type), out);
}

}  // namespace

grpc::ByteBuffer FrameTensorChunk(int32_t layer_id, v1::TensorSlot slot, uint64_t offset_bytes,
                                  const char* data, size_t size) {
  // The chunk's fields other than `data`, encoded by protobuf itself.
  v1::TensorChunk fields;
  fields.set_layer_id(layer_id);
  fields.set_slot(slot);
  fields.set_offset_bytes(offset_bytes);
  std::string inner = fields.SerializeAsString();
  if (size > 0) {  // proto3 leaves an empty bytes field out
    AppendTag(kChunkDataField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &inner);
    AppendVarint(size, &inner);
  }
  std::string header;
  AppendTag(kSessionTensorChunkField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &header);
  AppendVarint(inner.size() + size, &header);
  header += inner;
  grpc::Slice slice(header.size() + size);
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
  std::memcpy(out, header.data(), header.size());
  if (size > 0) std::memcpy(out + header.size(), data, size);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message) {
  grpc::ByteBuffer buffer;
  bool own = false;
  grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(message, &buffer, &own)
      .IgnoreError();  // fails only past 2 GiB, which no session message reaches
  return buffer;
}

}  // namespace kvtrim
