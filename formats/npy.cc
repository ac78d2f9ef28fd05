#include "formats/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kvtrim {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

/// True on a little-endian host (the only layout supported).
bool HostIsLittleEndian() {
  const uint16_t one = 1;
  unsigned char byte;
  std::memcpy(&byte, &one, 1);
  return byte == 1;
}

/// The value text after `'key':` in a header dict, up to the next top-level ',' or '}'.
absl::StatusOr<std::string> DictValue(absl::string_view header, absl::string_view key,
                                      absl::string_view source) {
  const std::string pattern = absl::StrCat("'", key, "':");
  const size_t at = header.find(pattern);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": .npy header has no '", key, "'"));
  }
  const size_t begin = at + pattern.size();
  int depth = 0;  // inside a tuple, ',' does not end the value
  size_t end = begin;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth <= 0 && (c == ',' || c == '}')) break;
  }
  return std::string(absl::StripAsciiWhitespace(header.substr(begin, end - begin)));
}

}  // namespace

int64_t NpyArray::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NpyDataBytes(const NpyArray& array) {
  std::string bytes(array.data.size() * sizeof(float), '\0');
  if (!array.data.empty()) std::memcpy(bytes.data(), array.data.data(), bytes.size());
  return bytes;
}

absl::StatusOr<std::string> SerializeNpy(const NpyArray& array) {
  if (!HostIsLittleEndian()) return absl::UnimplementedError("big-endian hosts are unsupported");
  for (int64_t d : array.shape) {
    if (d < 0) return absl::InvalidArgumentError("npy: negative dimension");
  }
  if (array.NumElements() != static_cast<int64_t>(array.data.size())) {
    return absl::InvalidArgumentError(absl::StrCat("npy: ", array.data.size(),
                                                   " values do not fill shape (",
                                                   absl::StrJoin(array.shape, ", "), ")"));
  }
  std::string shape = absl::StrJoin(array.shape, ", ");
  if (array.shape.size() == 1) shape += ",";
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", shape, "), }");
  // Exactly numpy's format.py: room to grow the first axis in place (21 digits), then
  // spaces and a final '\n' so that magic + version + length + header is a multiple of 64
  // bytes (a full 64 more when it already is).
  if (!array.shape.empty()) {
    const size_t digits = absl::StrCat(array.shape[0]).size();
    if (digits < 21) header.append(21 - digits, ' ');
  }
  const size_t prefix = kMagicSize + 2 + 2;
  const size_t pad = 64 - (prefix + header.size() + 1) % 64;
  header.append(pad, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicSize);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>((header.size() >> 8) & 0xff));
  out += header;
  out += NpyDataBytes(array);
  return out;
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view source) {
  if (!HostIsLittleEndian()) return absl::UnimplementedError("big-endian hosts are unsupported");
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (bytes.size() < kMagicSize + 4 || bytes.substr(0, kMagicSize) != kMagic) {
    return bad("not a .npy file (bad magic)");
  }
  const unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) |
                 (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    for (int i = 0; i < 4; ++i) {
      header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    }
    offset = 12;
  } else {
    return bad(absl::StrCat("unsupported .npy version ", major));
  }
  if (offset + header_len > bytes.size()) return bad("truncated header");
  const absl::string_view header = bytes.substr(offset, header_len);
  auto descr = DictValue(header, "descr", source);
  if (!descr.ok()) return descr.status();
  if (*descr != "'<f4'") return bad(absl::StrCat("dtype ", *descr, " is not '<f4' (float32)"));
  auto fortran = DictValue(header, "fortran_order", source);
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") return bad("fortran_order arrays are not supported");
  auto shape_text = DictValue(header, "shape", source);
  if (!shape_text.ok()) return shape_text.status();
  absl::string_view s = *shape_text;
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') {
    return bad(absl::StrCat("bad shape ", s));
  }
  NpyArray array;
  for (absl::string_view part : absl::StrSplit(s.substr(1, s.size() - 2), ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;
    int64_t dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim < 0) return bad(absl::StrCat("bad shape ", s));
    array.shape.push_back(dim);
  }
  // product(shape) in NumElements' order, refused where it overflows int64 (the product, or
  // its byte size, would otherwise wrap and pass the size check below).
  int64_t count = 1;
  for (int64_t dim : array.shape) {
    if (__builtin_mul_overflow(count, dim, &count)) {
      return bad(absl::StrCat("shape ", s, " is too large"));
    }
  }
  const size_t data_offset = offset + header_len;
  const size_t data_bytes = bytes.size() - data_offset;
  if (data_bytes % sizeof(float) != 0 ||
      data_bytes / sizeof(float) != static_cast<uint64_t>(count)) {
    return bad(absl::StrCat("data holds ", data_bytes, " bytes, shape ", s, " needs ", count,
                            " float32 values"));
  }
  array.data.resize(static_cast<size_t>(count));
  if (count > 0) std::memcpy(array.data.data(), bytes.data() + data_offset, count * sizeof(float));
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  auto bytes = SerializeNpy(array);
  if (!bytes.ok()) return bytes.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot open for writing"));
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseNpy(buffer.str(), path);
}

}  // namespace kvtrim
