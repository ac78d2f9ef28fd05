// Fuzz target: a CompressSession's input stream and its chunk protocol. The input is a
// stream of SessionRequest wire messages (fuzz/records.h). Each message is read as
// service/rpc_compress_session.cc reads it: a tensor_chunk straight from its wire bytes
// (PeekTensorChunk, CopyTensorChunkData), anything else parsed (ParseSessionRequest); then
// taken by SessionInput (chunk assembly, layer decoding) and checked by SessionFrontEnd
// (message order, policy, the engine's validation). Each message's bytes arrive cut into
// one to three slices, as gRPC may deliver them.
//
// Checked on every message: a tensor_chunk read from the wire equals the full parse of the
// same bytes, and the client's framing of it (client/chunk_framing.h) reads back the same.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/chunk_framing.h"
#include "fuzz/fuzz_service.h"
#include "fuzz/records.h"
#include "service/session_front_end.h"
#include "service/session_input.h"
#include "service/session_wire.h"

namespace kvtrim::fuzz {
namespace {

using service::SessionItem;
using service::WireTensorChunk;

/// Most messages of one input.
constexpr size_t kMaxMessages = 64;

/// A broken wire property: report it and abort (libFuzzer keeps the input).
[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kvtrim fuzz: session wire: %s\n", what.c_str());
  std::abort();
}

/// `bytes` as a ByteBuffer of `pieces` slices of about equal size.
grpc::ByteBuffer Buffer(absl::string_view bytes, size_t pieces) {
  std::vector<grpc::Slice> slices;
  const size_t step = bytes.size() / pieces + 1;
  for (size_t start = 0; start < bytes.size(); start += step) {
    slices.emplace_back(bytes.data() + start, std::min(step, bytes.size() - start));
  }
  if (slices.empty()) slices.emplace_back(grpc::Slice());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

/// The data bytes of `chunk` in `buffer`, or an abort when they cannot be copied.
std::string ChunkData(grpc::ByteBuffer& buffer, const WireTensorChunk& chunk) {
  std::string data(static_cast<size_t>(chunk.data_bytes), '\0');
  if (!service::CopyTensorChunkData(buffer, chunk, data.data())) Fail("data not copyable");
  return data;
}

/// A chunk read from the wire must be what protobuf parses from the same bytes, and the
/// client's framing of its fields must read back the same.
void CheckChunk(grpc::ByteBuffer& buffer, const WireTensorChunk& chunk) {
  v1::SessionRequest parsed;
  if (!service::ParseSessionRequest(buffer, &parsed).ok() || !parsed.has_tensor_chunk()) {
    Fail("a wire tensor_chunk that protobuf does not parse as one");
  }
  const v1::TensorChunk& full = parsed.tensor_chunk();
  const std::string data = ChunkData(buffer, chunk);
  if (full.layer_id() != chunk.layer_id || static_cast<int32_t>(full.slot()) != chunk.slot ||
      full.offset_bytes() != chunk.offset_bytes || full.data() != data) {
    Fail(absl::StrCat("wire fields differ from the parse: layer ", chunk.layer_id, " slot ",
                      chunk.slot, " offset ", chunk.offset_bytes));
  }
  grpc::ByteBuffer framed = FrameTensorChunk(chunk.layer_id,
                                             static_cast<v1::TensorSlot>(chunk.slot),
                                             chunk.offset_bytes, data.data(), data.size());
  std::optional<WireTensorChunk> again = service::PeekTensorChunk(framed);
  if (!again.has_value() || again->layer_id != chunk.layer_id || again->slot != chunk.slot ||
      again->offset_bytes != chunk.offset_bytes || ChunkData(framed, *again) != data) {
    Fail("the client's framing does not read back");
  }
}

/// The item one message completes, as SessionCall::Take reads it.
std::optional<SessionItem> Take(service::SessionInput& input, absl::string_view bytes,
                                size_t pieces) {
  grpc::ByteBuffer buffer = Buffer(bytes, pieces);
  if (std::optional<WireTensorChunk> chunk = service::PeekTensorChunk(buffer)) {
    CheckChunk(buffer, *chunk);
    const service::ChunkHeader header{chunk->layer_id, chunk->slot, chunk->offset_bytes,
                                      chunk->data_bytes};
    return input.TakeChunk(header, [&](char* destination) {
      return service::CopyTensorChunkData(buffer, *chunk, destination);
    });
  }
  auto request = std::make_unique<v1::SessionRequest>();
  if (absl::Status parsed = service::ParseSessionRequest(buffer, request.get()); !parsed.ok()) {
    SessionItem failed;
    failed.kind = SessionItem::Kind::kError;
    failed.status = parsed;
    return failed;
  }
  return input.Take(std::move(request), std::chrono::steady_clock::now());
}

/// With KVTRIM_FUZZ_VERBOSE set (replaying a corpus), prints each item's kind and status.
void Report(const SessionItem& item) {
  if (std::getenv("KVTRIM_FUZZ_VERBOSE") == nullptr) return;
  std::fprintf(stderr, "session item %d: %s\n", static_cast<int>(item.kind),
               item.status.ToString().c_str());
}

}  // namespace
}  // namespace kvtrim::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtrim;
  fuzz::FuzzService& fuzz = fuzz::FuzzService::Get();
  service::ServiceCore& core = fuzz.core();
  service::SessionInput input(core.engine().limits(), fuzz.MakeDecodeContext(),
                              core.transport_options().max_layer_bytes);
  service::SessionFrontEnd front_end(core);
  const std::vector<absl::string_view> messages =
      fuzz::SplitRecords(data, size, fuzz::kMaxMessages);
  bool ended = false;
  for (size_t i = 0; i < messages.size() && !ended; ++i) {
    std::optional<service::SessionItem> item = fuzz::Take(input, messages[i], 1 + i % 3);
    if (!item.has_value()) continue;  // a layer's chunks are still coming
    front_end.Process(&*item);
    ended = item->last();
    fuzz::Report(*item);
  }
  if (!ended) {
    service::SessionItem end = input.End(/*cancelled=*/false);
    front_end.Process(&end);
    fuzz::Report(end);
  }
  return 0;
}
