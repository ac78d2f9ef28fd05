// The load generator's synthetic layer: deterministic pseudo-random K, V and Q in the
// requested dtype, generated once and reused by every layer of every prefill.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "client/loadgen/config.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::loadgen {

/// `count` approximately standard-normal values (Box-Muller over a splitmix64 stream), the
/// same for the same `seed` on every platform.
std::vector<float> NormalSamples(uint64_t seed, size_t count);

/// `values` as little-endian element bytes of `dtype` (F32, F16 or BF16).
std::string EncodeAs(v1::DType dtype, const std::vector<float>& values);

/// One layer's tensors as the worker holds them on the host. In a region the tensors lie
/// back to back: keys, then values (when sent), then queries (when sent).
struct HostLayer {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> kv_shape;     // [H_kv, n, d]
  std::vector<int64_t> query_shape;  // [H_q, w, d]
  std::string keys;                  // [H_kv, n, d] element bytes
  std::string values;                // [H_kv, n, d], empty when values are not sent
  std::string queries;               // [H_q, w, d], empty when queries are not sent

  /// Byte offsets of the tensors inside one layer's region slot.
  uint64_t keys_offset() const { return 0; }
  uint64_t values_offset() const { return keys.size(); }
  uint64_t queries_offset() const { return keys.size() + values.size(); }
  /// Bytes of all tensors sent (one layer's region slot).
  uint64_t bytes() const { return keys.size() + values.size() + queries.size(); }
};

/// The synthetic layer of `config` (shapes, dtype, seed); values and queries only when
/// `values` / `queries` (what the policy needs).
HostLayer MakeHostLayer(const LoadgenConfig& config, bool values, bool queries);

/// A layer message with dtype and shape of every tensor `layer` holds, and no data (the
/// transport fills it in). softmax_scale is 0 (1/sqrt(d)).
v1::LayerInput LayerTemplate(const HostLayer& layer, int32_t layer_id);

}  // namespace kvtrim::loadgen
