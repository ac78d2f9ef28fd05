// Test-only helpers for the model registration tests: a registration (ModelInput) as the
// RegisterModelRequest messages a client would stream, in chunks of a chosen size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/model.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"
#include "service/model_codec.h"
#include "tests/testing/model_fixture.h"
#include "tests/testing/model_header_fixture.h"

namespace kvtrim::service::testing {

using kvtrim::testing::AddTestProfile;
using kvtrim::testing::HeaderOf;
using kvtrim::testing::MakeTestModelInput;


/// The chunks of one weight: `chunk_bytes` of data each; the first carries dtype, shape and
/// `manifest`.
inline std::vector<v1::RegisterModelRequest> WeightChunks(const std::string& name,
                                                          const RawTensor& t,
                                                          const std::string& manifest,
                                                          size_t chunk_bytes) {
  std::vector<v1::RegisterModelRequest> out;
  for (size_t offset = 0; offset < t.bytes.size(); offset += chunk_bytes) {
    v1::RegisterModelRequest r;
    v1::ModelWeightChunk* c = r.mutable_weight();
    c->set_name(name);
    c->set_offset_bytes(offset);
    c->set_data(t.bytes.substr(offset, chunk_bytes));
    if (offset == 0) {
      c->set_dtype(t.dtype == DType::kF32   ? v1::DTYPE_F32
                   : t.dtype == DType::kF16 ? v1::DTYPE_F16
                                            : v1::DTYPE_BF16);
      for (int64_t s : t.shape) c->add_shape(s);
      c->set_manifest_json(manifest);
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// The whole stream: header, then every tensor and profile in chunks of `chunk_bytes`.
/// `interleave` sends the weights' chunks round-robin instead of one weight after another.
inline std::vector<v1::RegisterModelRequest> ToStream(const ModelInput& input,
                                                      size_t chunk_bytes,
                                                      bool interleave = false) {
  std::vector<std::vector<v1::RegisterModelRequest>> weights;
  for (const auto& [name, t] : input.tensors) {
    weights.push_back(WeightChunks(name, t, "", chunk_bytes));
  }
  for (const auto& [name, p] : input.profiles) {
    weights.push_back(WeightChunks("profile." + name, p.ratios, CanonicalManifestJson(p),
                                   chunk_bytes));
  }
  std::vector<v1::RegisterModelRequest> out(1);
  *out[0].mutable_header() = HeaderOf(input);
  if (!interleave) {
    for (auto& w : weights) out.insert(out.end(), w.begin(), w.end());
    return out;
  }
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (auto& w : weights) {
      if (i < w.size()) {
        out.push_back(w[i]);
        any = true;
      }
    }
    if (!any) return out;
  }
}

/// Registers `input` through `stub` (RegisterModel, chunks of `chunk_bytes`); returns its
/// digest, or "" with a test failure when the call fails.
inline std::string RegisterThrough(v1::Kvtrim::Stub& stub, const ModelInput& input,
                                   size_t chunk_bytes) {
  grpc::ClientContext context;
  v1::RegisterModelResponse response;
  auto writer = stub.RegisterModel(&context, &response);
  for (const auto& message : ToStream(input, chunk_bytes)) EXPECT_TRUE(writer->Write(message));
  writer->WritesDone();
  const grpc::Status st = writer->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  return response.digest();
}

}  // namespace kvtrim::service::testing
