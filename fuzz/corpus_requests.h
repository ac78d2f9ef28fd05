// Seeds of the request and session fuzz targets (fuzz/make_corpus.cc): real K/V/Q sliced
// from samples/stories260k_prefill.safetensors, sent as kvtrim's clients send them.
#pragma once

#include <map>
#include <string>

#include "formats/safetensors.h"
#include "kernels/registry.h"

namespace kvtrim::fuzz {

/// Seed name -> bytes.
using Seeds = std::map<std::string, std::string>;

/// CompressRequest wire bytes: one request per policy preset (its parameters at their
/// defaults) and per scorer + allocator composition over snapkv, plus variants of dtype,
/// budget, protected tokens, output shape, answer encoding, numerics and perturbation.
/// `digest` names the sample model (fuzz/sample_model.h) for the policies that need one.
Seeds CompressRequestSeeds(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                           const std::string& digest);

/// CompressSession streams (fuzz/records.h): inline layers, chunked layers (framed as the
/// C++ client frames them), a model-wide policy answered at finish, LU-KV with the model.
Seeds SessionSeeds(const SafetensorsFile& prefill, const PolicyRegistry& registry,
                   const std::string& digest);

}  // namespace kvtrim::fuzz
