// TokenRows (token_rows.h); the widening is Highway SIMD chosen at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fast/token_rows.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include <algorithm>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvtrim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// dst[i] = src[i] widened to fp32 for src bf16 (`bf16`) or f16 bit patterns, over whole
/// vectors of the first `count`; returns how many it converted (the caller does the tail).
int64_t WidenToF32(const uint16_t* src, bool bf16, int64_t count, float* dst) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if (bf16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(df)> db;
    const auto* s = reinterpret_cast<const hwy::bfloat16_t*>(src);
    for (; i + lanes <= count; i += lanes) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, s + i)), df, dst + i);
    }
  } else {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    const auto* s = reinterpret_cast<const hwy::float16_t*>(src);
    for (; i + lanes <= count; i += lanes) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, dst + i);
    }
  }
  return i;
}

/// True when every x[0..count) is finite (the exponent bits of no element all ones).
bool AllFiniteF32(const float* x, int64_t count) {
  const hn::ScalableTag<uint32_t> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const auto* bits = reinterpret_cast<const uint32_t*>(x);
  const auto exponent = hn::Set(du, 0x7F800000u);
  auto seen = hn::Zero(du);
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    seen = hn::Max(seen, hn::And(hn::LoadU(du, bits + i), exponent));
  }
  uint32_t largest = hn::GetLane(hn::MaxOfLanes(du, seen));
  for (; i < count; ++i) largest = std::max(largest, bits[i] & 0x7F800000u);
  return largest != 0x7F800000u;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#include <cstring>

#include "kernels/cpu/fast/token_rows.h"

namespace kvtrim {

HWY_EXPORT(WidenToF32);
HWY_EXPORT(AllFiniteF32);

namespace {

TokenRows RowsOf(const TensorView& arrived, const F32Tensor& widened, int64_t d) {
  if (arrived.present() && arrived.host_readable()) return {arrived.data, arrived.dtype, d};
  return {widened.data(), DType::kF32, d};
}

}  // namespace

TokenRows TokenRows::Keys(const CpuLayer& layer) {
  TokenRows rows = RowsOf(layer.keys_in, layer.keys, layer.shape.head_dim);
  rows.nonfinite = layer.keys_nonfinite.get();
  return rows;
}

TokenRows TokenRows::Values(const CpuLayer& layer) {
  return RowsOf(layer.values_in, layer.values, layer.shape.head_dim);
}

TokenRows TokenRows::From(int64_t first) const {
  const auto* bytes = static_cast<const uint8_t*>(data);
  return {bytes + first * d * static_cast<int64_t>(DTypeSize(dtype)), dtype, d, nonfinite};
}

const float* TokenRows::Rows(int64_t first, int64_t count, std::vector<float>* scratch) const {
  const float* rows = nullptr;
  if (dtype == DType::kF32) {
    rows = static_cast<const float*>(data) + first * d;
  } else {
    scratch->resize(static_cast<size_t>(count * d));
    CopyRows(first, count, scratch->data());  // f16 / bf16 NaN and Inf widen to themselves
    rows = scratch->data();
  }
  if (nonfinite != nullptr && !HWY_DYNAMIC_DISPATCH(AllFiniteF32)(rows, count * d)) {
    nonfinite->store(true, std::memory_order_relaxed);
  }
  return rows;
}

void CheckKeysRead(const CpuLayer& layer) {
  if (layer.keys_nonfinite == nullptr) return;
  const TokenRows keys = TokenRows::Keys(layer);
  const int64_t rows = layer.shape.num_kv_heads * layer.shape.num_tokens;
  std::vector<float> scratch;
  for (int64_t first = 0; first < rows; first += 256) {
    keys.Rows(first, std::min<int64_t>(256, rows - first), &scratch);
  }
}

void TokenRows::CopyRows(int64_t first, int64_t count, float* out) const {
  if (dtype == DType::kF32) {
    std::memcpy(out, static_cast<const float*>(data) + first * d,
                static_cast<size_t>(count * d) * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(data) + first * d;
  const int64_t done =
      HWY_DYNAMIC_DISPATCH(WidenToF32)(src, dtype == DType::kBF16, count * d, out);
  ConvertToF32(dtype, src + done, static_cast<size_t>(count * d - done), out + done);
}

}  // namespace kvtrim

#endif  // HWY_ONCE
