// Element types of the tensors kvtrim reads and writes (the one dtype vocabulary of every
// module: kernels, formats, service, client), and conversion between f32 and f16/bf16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvtrim {

/// Element type of an input tensor. All arithmetic is fp32 regardless of the input type.
enum class DType : uint8_t { kF32, kF16, kBF16 };

/// Bytes per element of `dtype`.
constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

/// Lower-case name ("f32", "f16", "bf16").
const char* DTypeName(DType dtype);

/// Converts one bfloat16 bit pattern to float (exact).
inline float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Converts float to the nearest bfloat16 (round to nearest even; NaN stays NaN).
uint16_t FloatToBf16(float value);

/// Converts one IEEE binary16 bit pattern to float (exact, subnormals included).
float F16ToFloat(uint16_t bits);

/// Converts float to the nearest binary16 (round to nearest even, overflow to inf).
uint16_t FloatToF16(float value);

/// Rounds a float to the nearest bfloat16 value and back (used by DropKV's bf16 rounding).
inline float RoundToBf16(float value) { return Bf16ToFloat(FloatToBf16(value)); }

/// Converts `count` elements of `dtype` at `src` to float at `dst`.
void ConvertToF32(DType dtype, const void* src, size_t count, float* dst);

}  // namespace kvtrim
