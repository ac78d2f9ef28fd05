#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kvtrim {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own limit
constexpr char kMetadataKey[] = "__metadata__";

bool ParseDType(const std::string& name, DType* dtype) {
  if (name == "F32") {
    *dtype = DType::kF32;
  } else if (name == "F16") {
    *dtype = DType::kF16;
  } else if (name == "BF16") {
    *dtype = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

/// A non-negative JSON integer, or false.
bool ReadCount(const Json& value, uint64_t* out) {
  if (!value.is_number_unsigned()) return false;
  *out = value.get<uint64_t>();
  return true;
}

/// A header's `shape` array as JSON text for messages. One holding arrays or objects is not
/// printed: dump() recurses once per nesting level, and a deeply nested shape overflowed
/// the stack.
std::string ShapeText(const Json& shape) {
  for (const Json& dim : shape) {
    if (!dim.is_primitive()) return "[...] (holding arrays or objects)";
  }
  return shape.dump();
}

/// Where one tensor's bytes sit in the data section, before they are copied.
struct Entry {
  std::string name;
  SafetensorsTensor tensor;  // without data
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// Validates one header entry (everything but its position relative to the others).
absl::StatusOr<Entry> ParseEntry(const std::string& name, const Json& value,
                                 uint64_t data_size, const std::string& where) {
  Entry entry;
  entry.name = name;
  if (!value.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, "is not an object"));

  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "\"dtype\" is missing or not a string"));
  }
  if (!ParseDType(dtype->get_ref<const std::string&>(), &entry.tensor.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(where, "dtype \"", dtype->get_ref<const std::string&>(),
                                                   "\" is not supported (F32, F16, BF16)"));
  }

  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "\"shape\" is missing or not an array"));
  }
  uint64_t bytes = static_cast<uint64_t>(DTypeSize(entry.tensor.dtype));
  bool overflow = false;
  for (const Json& dim : *shape) {
    uint64_t extent = 0;
    if (!ReadCount(dim, &extent) || extent > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "shape ", ShapeText(*shape), " has a non-integer or negative extent"));
    }
    overflow |= __builtin_mul_overflow(bytes, extent, &bytes);
    entry.tensor.shape.push_back(static_cast<int64_t>(extent));
  }
  // Refused whenever the running product overflows, even if a later extent is 0:
  // NumElements() (and the writer) would overflow on such a shape.
  if (overflow) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "shape ", ShapeText(*shape), " is too large"));
  }

  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !ReadCount((*offsets)[0], &entry.begin) || !ReadCount((*offsets)[1], &entry.end)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "\"data_offsets\" must be two non-negative integers"));
  }
  if (entry.begin > entry.end || entry.end > data_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, "data_offsets [", entry.begin, ", ",
                                                   entry.end, "] lie outside the data section (",
                                                   data_size, " bytes)"));
  }
  if (entry.end - entry.begin != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "data_offsets [", entry.begin, ", ", entry.end, "] hold ", entry.end - entry.begin,
        " bytes but shape ", ShapeText(*shape), " of ", SafetensorsDTypeName(entry.tensor.dtype),
        " needs ", bytes));
  }
  return entry;
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

int64_t SafetensorsTensor::NumElements() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 absl::string_view source) {
  const std::string prefix = absl::StrCat("safetensors \"", source, "\": ");
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "file has ", bytes.size(), " bytes, fewer than the 8-byte header length"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header length ", header_size,
                                                   " exceeds the file (", bytes.size() - 8,
                                                   " bytes after the length) or 100 MB"));
  }
  const absl::string_view header = bytes.substr(8, header_size);
  const absl::string_view data = bytes.substr(8 + header_size);

  Json json = Json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "header is not a JSON object"));
  }

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it.value().is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, "__metadata__ is not an object"));
      }
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(prefix, "__metadata__ \"", m.key(), "\" is not a string"));
        }
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat(prefix, "tensor \"", it.key(), "\": ");
    absl::StatusOr<Entry> entry = ParseEntry(it.key(), it.value(), data.size(), where);
    if (!entry.ok()) return entry.status();
    entries.push_back(*std::move(entry));
  }

  // Tensors tile the data section exactly, as the reference implementation requires.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t expected = 0;
  for (Entry& entry : entries) {
    if (entry.begin != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "tensor \"", entry.name, "\": data_offsets start at ", entry.begin,
          entry.begin < expected ? ", overlapping the previous tensor" : ", leaving a gap",
          " (expected ", expected, ")"));
    }
    expected = entry.end;
    entry.tensor.data.assign(data.data() + entry.begin, entry.end - entry.begin);
    file.tensors[entry.name] = std::move(entry.tensor);
  }
  if (expected != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "the tensors cover ", expected,
                                                   " bytes of a ", data.size(),
                                                   "-byte data section"));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  // Mapped read-only and parsed in place: the tensors are copied once, out of the page
  // cache (a buffer of the file's size cost a zero-fill and a read copy of every byte of a
  // multi-GB model bundle first).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("safetensors \"", path, "\": cannot open"));
  struct stat info {};
  if (fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0) {
    const size_t size = static_cast<size_t>(info.st_size);
    void* mapped = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (mapped != MAP_FAILED) {
      absl::StatusOr<SafetensorsFile> file =
          ParseSafetensors(absl::string_view(static_cast<const char*>(mapped), size), path);
      munmap(mapped, size);
      return file;
    }
  } else {
    close(fd);
  }
  // Not a mappable regular file: one read into a buffer of its size.
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("safetensors \"", path, "\": cannot open"));
  const std::streamoff size = in.tellg();
  if (size < 0) return absl::InternalError(absl::StrCat("safetensors \"", path, "\": read error"));
  std::string contents(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(contents.data(), size)) {
    return absl::InternalError(absl::StrCat("safetensors \"", path, "\": read error"));
  }
  return ParseSafetensors(contents, path);
}

absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file) {
  Json header = Json::object();
  if (!file.metadata.empty()) {
    Json metadata = Json::object();
    for (const auto& [key, value] : file.metadata) metadata[key] = value;
    header[kMetadataKey] = std::move(metadata);
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.empty() || name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name \"", name, "\" is reserved"));
    }
    for (int64_t extent : tensor.shape) {
      if (extent < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\": negative extent in shape [",
                         absl::StrJoin(tensor.shape, ", "), "]"));
      }
    }
    const uint64_t bytes = static_cast<uint64_t>(tensor.NumElements()) * DTypeSize(tensor.dtype);
    if (bytes != tensor.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\": ", tensor.data.size(), " bytes of data but shape [",
          absl::StrJoin(tensor.shape, ", "), "] of ", SafetensorsDTypeName(tensor.dtype),
          " needs ", bytes));
    }
    header[name] = {{"dtype", SafetensorsDTypeName(tensor.dtype)},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  out += text;
  for (const auto& [name, tensor] : file.tensors) out += tensor.data;
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(file);
  if (!bytes.ok()) return bytes.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("safetensors \"", path, "\": write failed"));
  return absl::OkStatus();
}

}  // namespace kvtrim
