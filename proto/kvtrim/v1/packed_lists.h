// The byte format of kvtrim.v1.PackedLists (ANSWER_ENCODING_PACKED), shared by the server that
// writes it and the client library that reads it: little-endian int64 offsets, and token
// indices of 2 bytes when the layer has at most 65536 tokens, else 4 (a 3-byte form would be
// a quarter smaller on the wire at 128K but costs more CPU to write and read than it saves on
// a node-local link). Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kvtrim::v1 {

/// Bytes per index of PackedLists.indices for a layer of `num_tokens` tokens.
constexpr uint32_t PackedIndexBytes(int64_t num_tokens) {
  return num_tokens <= (int64_t{1} << 16) ? 2 : 4;
}

/// The most tokens a layer may have for indices `width` bytes wide (2 or 4).
constexpr int64_t PackedIndexCapacity(uint32_t width) {
  return width >= 4 ? (int64_t{1} << 31) : (int64_t{1} << (8 * width));
}

/// True on little-endian hosts (the wire order): values are copied as they are.
constexpr bool HostIsLittleEndian() {
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
  return __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
  return false;  // unknown: the byte-by-byte path is right on any host
#endif
}

/// Stores the low `width` bytes of `value` at `out`, least significant first.
inline void StoreLittleEndian(uint64_t value, uint32_t width, char* out) {
  if (HostIsLittleEndian()) {
    std::memcpy(out, &value, width);
    return;
  }
  for (uint32_t b = 0; b < width; ++b) out[b] = static_cast<char>((value >> (8 * b)) & 0xFF);
}

/// The `width`-byte little-endian unsigned value at `in`.
inline uint64_t LoadLittleEndian(const char* in, uint32_t width) {
  uint64_t value = 0;
  if (HostIsLittleEndian()) {
    std::memcpy(&value, in, width);
    return value;
  }
  for (uint32_t b = 0; b < width; ++b) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[b])) << (8 * b);
  }
  return value;
}

/// Writes offsets [count] as 8-byte little-endian values into `out` (replacing it).
inline void PackOffsets(const int64_t* offsets, size_t count, std::string* out) {
  out->resize(count * 8);
  char* p = out->data();
  if (HostIsLittleEndian()) {
    if (count > 0) std::memcpy(p, offsets, count * 8);
    return;
  }
  for (size_t i = 0; i < count; ++i) StoreLittleEndian(static_cast<uint64_t>(offsets[i]), 8, p + 8 * i);
}

/// Writes indices [count] (each in [0, 2^(8 width))) as `width`-byte (2 or 4)
/// little-endian values into `out` (replacing it).
inline void PackIndices(const int32_t* indices, size_t count, uint32_t width, std::string* out) {
  if (HostIsLittleEndian() && width == 4) {  // one copy, no zero-fill first
    out->assign(reinterpret_cast<const char*>(indices), count * 4);
    return;
  }
  out->resize(count * width);
  char* p = out->data();
  if (HostIsLittleEndian() && width == 2) {
    for (size_t i = 0; i < count; ++i) {
      const uint16_t v = static_cast<uint16_t>(indices[i]);
      std::memcpy(p + 2 * i, &v, 2);
    }
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    StoreLittleEndian(static_cast<uint32_t>(indices[i]), width, p + width * i);
  }
}

/// Reads `count` packed indices of `width` bytes (2 or 4) from `in` into `out`.
inline void UnpackIndices(const char* in, size_t count, uint32_t width, int32_t* out) {
  if (HostIsLittleEndian() && width == 4) {
    if (count > 0) std::memcpy(out, in, count * 4);
    return;
  }
  if (HostIsLittleEndian() && width == 2) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, in + 2 * i, 2);
      out[i] = v;
    }
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    out[i] = static_cast<int32_t>(LoadLittleEndian(in + width * i, width));
  }
}

}  // namespace kvtrim::v1
