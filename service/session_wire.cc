#include "service/session_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtrim::service {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

constexpr uint32_t kLengthDelimited = WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
constexpr uint32_t kVarint = WireFormatLite::WIRETYPE_VARINT;

}  // namespace

std::optional<WireTensorChunk> PeekTensorChunk(grpc::ByteBuffer& message) {
  const int64_t total = static_cast<int64_t>(message.Length());
  grpc::ProtoBufferReader reader(&message);
  CodedInputStream in(&reader);
  // The SessionRequest: exactly one field, tensor_chunk, spanning the rest of the bytes.
  if (in.ReadTag() != WireFormatLite::MakeTag(v1::SessionRequest::kTensorChunkFieldNumber,
                                               WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
    return std::nullopt;
  }
  uint32_t inner = 0;
  if (!in.ReadVarint32(&inner) || in.CurrentPosition() + int64_t{inner} != total) {
    return std::nullopt;
  }
  WireTensorChunk chunk;
  bool have_data = false;
  while (in.CurrentPosition() < total) {
    const uint32_t tag = in.ReadTag();
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const uint32_t type = WireFormatLite::GetTagWireType(tag);
    uint64_t value = 0;
    switch (field) {
      case v1::TensorChunk::kLayerIdFieldNumber:
        if (type != kVarint || !in.ReadVarint64(&value)) return std::nullopt;
        chunk.layer_id = static_cast<int32_t>(value);  // int32: the low 32 bits
        break;
      case v1::TensorChunk::kSlotFieldNumber:
        if (type != kVarint || !in.ReadVarint64(&value)) return std::nullopt;
        chunk.slot = static_cast<int32_t>(value);
        break;
      case v1::TensorChunk::kOffsetBytesFieldNumber:
        if (type != kVarint || !in.ReadVarint64(&chunk.offset_bytes)) return std::nullopt;
        break;
      case v1::TensorChunk::kDataFieldNumber: {
        uint32_t size = 0;
        if (type != kLengthDelimited || have_data || !in.ReadVarint32(&size)) {
          return std::nullopt;
        }
        chunk.data_position = in.CurrentPosition();
        chunk.data_bytes = size;
        have_data = true;
        if (!in.Skip(static_cast<int>(size))) return std::nullopt;
        break;
      }
      default:
        return std::nullopt;  // an unknown field (or the end of a malformed message)
    }
  }
  if (in.CurrentPosition() != total) return std::nullopt;
  return chunk;
}

bool CopyTensorChunkData(grpc::ByteBuffer& message, const WireTensorChunk& chunk,
                         char* destination) {
  grpc::ProtoBufferReader reader(&message);
  if (chunk.data_position > 0 && !reader.Skip(static_cast<int>(chunk.data_position))) {
    return false;
  }
  int64_t left = chunk.data_bytes;
  const void* data = nullptr;
  int size = 0;
  while (left > 0 && reader.Next(&data, &size)) {
    const int64_t take = std::min<int64_t>(left, size);
    std::memcpy(destination, data, static_cast<size_t>(take));
    destination += take;
    left -= take;
  }
  return left == 0;
}

absl::Status ParseSessionRequest(grpc::ByteBuffer& message, v1::SessionRequest* request) {
  grpc::ProtoBufferReader reader(&message);
  if (!request->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SessionRequest: a message of ", message.Length(),
        " bytes is not a valid SessionRequest (undecodable protobuf)"));
  }
  return absl::OkStatus();
}

grpc::ByteBuffer SerializeSessionResponse(const v1::SessionResponse& response) {
  grpc::ByteBuffer buffer;
  bool own = false;
  grpc::SerializationTraits<v1::SessionResponse>::Serialize(response, &buffer, &own)
      .IgnoreError();  // fails only past 2 GiB, which no answer reaches
  return buffer;
}

}  // namespace kvtrim::service
