// Test models as client bundles (header-only): MakeTestModelInput (tests/testing/model_fixture.h)
// converted to a kvtrim::ModelBundle, so that the client and integration tests register
// exactly the content the service tests build.
#pragma once

#include <cstdint>
#include <string>

#include "client/model_bundle.h"
#include "tests/testing/model_fixture.h"
#include "tests/testing/model_header_fixture.h"

namespace kvtrim::testing {

/// The bundle of a registration: same header, tensors (f32) and profile manifests.
inline ModelBundle BundleFromModelInput(const ModelInput& input) {
  ModelBundle bundle;
  bundle.header = HeaderOf(input);
  auto convert = [](const RawTensor& raw) {
    SafetensorsTensor t;
    t.dtype = raw.dtype;
    t.shape = raw.shape;
    t.data = raw.bytes;
    return t;
  };
  for (const auto& [name, raw] : input.tensors) bundle.weights[name] = convert(raw);
  for (const auto& [name, profile] : input.profiles) {
    const std::string weight = "profile." + name;
    bundle.weights[weight] = convert(profile.ratios);
    bundle.manifests[weight] = "{\"metric\":\"" + profile.metric +
                               "\",\"sink\":" + std::to_string(profile.sink) +
                               ",\"window\":" + std::to_string(profile.window) + "}";
  }
  return bundle;
}

/// MakeTestModelInput(...) as a bundle.
inline ModelBundle MakeTestModelBundle(int L, int Hq, int Hkv, int d, int D, uint64_t seed,
                                       bool with_query_stats) {
  return BundleFromModelInput(MakeTestModelInput(L, Hq, Hkv, d, D, seed, with_query_stats));
}

}  // namespace kvtrim::testing
