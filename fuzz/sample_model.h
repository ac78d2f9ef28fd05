// The sample model (samples/stories260k_model.safetensors: 5 layers, H_q 8, H_kv 4, d 8,
// W_O, query statistics and the LU-KV profile "snapkv") as the RegisterModel stream a client
// sends for it, assembled and registered through the service's own code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/model_bundle.h"
#include "kernels/model.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "service/model_store.h"

namespace kvtrim::fuzz {

/// samples/stories260k_model.safetensors in the source tree.
std::string SampleModelPath();

/// The RegisterModel stream of `bundle`: the header, then each weight in name order as
/// chunks of at most `chunk_bytes` bytes (the first with dtype, shape and, for a profile,
/// its manifest).
std::vector<v1::RegisterModelRequest> RegistrationStream(const ModelBundle& bundle,
                                                         int64_t chunk_bytes);

/// `stream` assembled as kvtrimd's RegisterModel call assembles it (ModelAssembler).
absl::StatusOr<ModelInput> AssembleModel(const std::vector<v1::RegisterModelRequest>& stream,
                                         int64_t max_model_bytes);

/// Registers the bundle at `path` in `store` as kvtrimd does (assembled, then
/// ModelStore::Add); returns the model's digest.
absl::StatusOr<std::string> RegisterBundle(const std::string& path,
                                           service::ModelStore* store);

}  // namespace kvtrim::fuzz
