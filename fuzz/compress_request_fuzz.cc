// Fuzz target: a Compress call's request. The input is the wire bytes of a CompressRequest;
// it goes through the Compress RPC's own work (service::CompressRequestLayers: decode the
// settings and every layer, resolve the policy with the registered model, validate, compute
// on the CPU backend, encode) and the answer's kept lists are checked: CSR offsets from 0 to the
// number of indices, each list ascending inside [0, n). With KVTRIM_FUZZ_VERBOSE set, each
// input's status is printed (replaying a corpus).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_service.h"
#include "kvtrim/v1/packed_lists.h"
#include "service/rpcs.h"

namespace kvtrim::fuzz {
namespace {

/// Largest request taken (kvtrimd's --max_message_bytes refuses larger ones before any
/// decoding; lowered here to keep each run short).
constexpr size_t kMaxRequestBytes = size_t{1} << 20;

/// A broken property of the answer: report it and abort (libFuzzer keeps the input).
[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kvtrim fuzz: compress answer: %s\n", what.c_str());
  std::abort();
}

/// Checks one kept list [begin, end) of `indices`: ascending, inside [0, n).
void CheckList(const std::vector<int64_t>& indices, int64_t begin, int64_t end, int64_t n) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t index = indices[static_cast<size_t>(i)];
    if (index < 0 || index >= n) Fail(absl::StrCat("index ", index, " outside [0, ", n, ")"));
    if (i > begin && index <= indices[static_cast<size_t>(i - 1)]) {
      Fail(absl::StrCat("indices not ascending at ", i));
    }
  }
}

/// Checks the kept lists of one answered layer, repeated or packed.
void CheckResult(const v1::LayerResult& result) {
  if (result.output_written()) return;
  std::vector<int64_t> offsets(result.offsets().begin(), result.offsets().end());
  std::vector<int64_t> indices(result.indices().begin(), result.indices().end());
  if (result.has_packed()) {
    const v1::PackedLists& packed = result.packed();
    const std::string& bytes = packed.offsets();
    if (bytes.size() % 8 != 0) Fail("packed offsets not 8-byte values");
    offsets.resize(bytes.size() / 8);
    for (size_t i = 0; i < offsets.size(); ++i) {
      offsets[i] = static_cast<int64_t>(v1::LoadLittleEndian(bytes.data() + 8 * i, 8));
    }
    const uint32_t width = packed.index_bytes();
    if (width != 2 && width != 4) Fail(absl::StrCat("packed index width ", width));
    if (packed.indices().size() % width != 0) Fail("packed indices not whole values");
    std::vector<int32_t> unpacked(packed.indices().size() / width);
    v1::UnpackIndices(packed.indices().data(), unpacked.size(), width, unpacked.data());
    indices.assign(unpacked.begin(), unpacked.end());
  }
  if (offsets.size() < 2 || offsets.front() != 0 ||
      offsets.back() != static_cast<int64_t>(indices.size())) {
    Fail(absl::StrCat("layer ", result.layer_id(), ": offsets do not span the indices"));
  }
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) Fail("offsets decrease");
    CheckList(indices, offsets[i - 1], offsets[i], result.num_tokens());
  }
}

/// The Compress RPC's own work (service::CompressRequestLayers) without a call: nothing
/// to cancel, regions of the fuzz service's client.
absl::Status Compress(FuzzService& fuzz, const v1::CompressRequest& request,
                      v1::CompressResponse* response) {
  return service::CompressRequestLayers(
      fuzz.core(), fuzz.MakeDecodeContext(),
      [](const std::string&) { return absl::OkStatus(); }, request, response);
}

}  // namespace
}  // namespace kvtrim::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtrim;
  if (size > fuzz::kMaxRequestBytes) return -1;  // refused before decoding, not a corpus entry
  v1::CompressRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  v1::CompressResponse response;
  const absl::Status status = fuzz::Compress(fuzz::FuzzService::Get(), request, &response);
  if (std::getenv("KVTRIM_FUZZ_VERBOSE") != nullptr) {  // replaying inputs: say what happened
    std::fprintf(stderr, "compress: %s\n", status.ToString().c_str());
  }
  if (!status.ok()) return 0;
  if (response.layers_size() != request.layers_size()) fuzz::Fail("one answer per layer");
  for (const v1::LayerResult& result : response.layers()) fuzz::CheckResult(result);
  return 0;
}
