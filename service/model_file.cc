#include "service/model_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "formats/safetensors.h"
#include "nlohmann/json.hpp"
#include "service/model_codec.h"

namespace kvtrim::service {

namespace {

constexpr char kProfilePrefix[] = "profile.";
constexpr char kManifestSuffix[] = ".manifest";

/// An OS error on `path` as a status: RESOURCE_EXHAUSTED for a full disk, else INTERNAL.
absl::Status OsError(const char* what, const std::string& path, int error) {
  const std::string message =
      absl::StrCat("model file ", path, ": ", what, ": ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

/// Writes all of `data` to `fd`.
bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

/// The metadata every model file carries (also the client bundle's keys).
std::map<std::string, std::string> Metadata(const ModelInput& input, const std::string& digest) {
  const ModelLayout& m = input.layout;
  std::map<std::string, std::string> meta = {
      {"format", kModelFileFormat},
      {"digest", digest},
      {"name", m.name},
      {"num_layers", absl::StrCat(m.num_layers)},
      {"num_query_heads", absl::StrCat(m.num_query_heads)},
      {"num_kv_heads", absl::StrCat(m.num_kv_heads)},
      {"head_dim", absl::StrCat(m.head_dim)},
      {"hidden_size", absl::StrCat(m.hidden_size)},
      // %.17g round-trips every double exactly (the digest covers its bits).
      {"rope_theta", absl::StrFormat("%.17g", input.rope_theta)},
      {"rope_scaling_json", input.rope_scaling_json},
      {"rope_layout", input.rope_layout},
  };
  for (const auto& [name, profile] : input.profiles) {
    meta[absl::StrCat(kProfilePrefix, name, kManifestSuffix)] = CanonicalManifestJson(profile);
  }
  return meta;
}

/// The safetensors header (JSON, space-padded to a multiple of 8) for `input`; tensors are
/// laid out in name order ("layers.*" before "profile.*").
std::string SafetensorsHeader(const ModelInput& input, const std::string& digest) {
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : Metadata(input, digest)) meta[key] = value;
  header["__metadata__"] = std::move(meta);
  uint64_t offset = 0;
  auto add = [&](const std::string& name, const RawTensor& t) {
    header[name] = {{"dtype", SafetensorsDTypeName(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  };
  for (const auto& [name, tensor] : input.tensors) add(name, tensor);
  for (const auto& [name, profile] : input.profiles) {
    add(absl::StrCat(kProfilePrefix, name), profile.ratios);
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

/// Reads a whole regular file of at most `max_bytes` bytes.
absl::StatusOr<std::string> ReadAll(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("model file ", path, ": missing"));
    return OsError("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return OsError("fstat", path, error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError("not a regular file");
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the file has ", st.st_size, " bytes, more than a model may (", max_bytes,
        " bytes: --max_model_bytes and its header)"));
  }
  std::string bytes;
  try {
    bytes.assign(static_cast<size_t>(st.st_size), '\0');
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", st.st_size, " bytes to read it"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return OsError("read", path, error);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

/// A required integer metadata value.
absl::Status ReadInt(const std::map<std::string, std::string>& meta, const char* key,
                     int32_t* out) {
  auto it = meta.find(key);
  if (it == meta.end() || !absl::SimpleAtoi(it->second, out)) {
    return absl::DataLossError(absl::StrCat("__metadata__.", key, " is missing or not an integer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteModelFile(const std::string& path, const ModelInput& input,
                            const std::string& digest) {
  const std::string header = SafetensorsHeader(input, digest);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return OsError("create", tmp, errno);
  auto fail = [&](const char* what) {
    const int error = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return OsError(what, tmp, error);
  };
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  if (!WriteAll(fd, length, sizeof length) || !WriteAll(fd, header.data(), header.size())) {
    return fail("write");
  }
  for (const auto& [name, tensor] : input.tensors) {
    if (!WriteAll(fd, tensor.bytes.data(), tensor.bytes.size())) return fail("write");
  }
  for (const auto& [name, profile] : input.profiles) {
    if (!WriteAll(fd, profile.ratios.bytes.data(), profile.ratios.bytes.size())) {
      return fail("write");
    }
  }
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return OsError("close", tmp, error);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return OsError("rename", path, error);
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return OsError("open directory", dir, errno);
  const int synced = ::fsync(dir_fd);
  const int error = errno;
  ::close(dir_fd);
  if (synced != 0) return OsError("fsync directory", dir, error);
  return absl::OkStatus();
}

absl::StatusOr<ModelFileContents> ReadModelFile(const std::string& path,
                                                int64_t max_file_bytes) {
  auto bytes = ReadAll(path, max_file_bytes);
  if (!bytes.ok()) return bytes.status();
  auto file = ParseSafetensors(*bytes, path);
  if (!file.ok()) {
    // A truncated or corrupt file; the parser's message names what is wrong.
    return absl::DataLossError(file.status().message());
  }
  bytes->clear();
  bytes->shrink_to_fit();
  const auto& meta = file->metadata;
  auto format = meta.find("format");
  if (format == meta.end() || format->second != kModelFileFormat) {
    return absl::DataLossError(absl::StrCat("__metadata__.format is not \"", kModelFileFormat,
                                            "\" (not a kvtrimd model file)"));
  }
  ModelFileContents contents;
  auto digest = meta.find("digest");
  if (digest == meta.end()) return absl::DataLossError("__metadata__.digest is missing");
  contents.stored_digest = digest->second;
  ModelInput& input = contents.input;
  ModelLayout& m = input.layout;
  if (auto it = meta.find("name"); it != meta.end()) m.name = it->second;
  if (m.name.size() > kMaxModelNameBytes) {  // written by a server without the limit
    return absl::DataLossError(absl::StrCat("__metadata__.name has ", m.name.size(),
                                            " bytes, more than ", kMaxModelNameBytes));
  }
  for (auto [key, out] : {std::pair<const char*, int32_t*>{"num_layers", &m.num_layers},
                          {"num_query_heads", &m.num_query_heads},
                          {"num_kv_heads", &m.num_kv_heads},
                          {"head_dim", &m.head_dim},
                          {"hidden_size", &m.hidden_size}}) {
    KVTRIM_RETURN_IF_ERROR(ReadInt(meta, key, out));
  }
  auto theta = meta.find("rope_theta");
  if (theta == meta.end() || !absl::SimpleAtod(theta->second, &input.rope_theta)) {
    return absl::DataLossError("__metadata__.rope_theta is missing or not a number");
  }
  if (auto it = meta.find("rope_layout"); it != meta.end()) input.rope_layout = it->second;
  if (auto it = meta.find("rope_scaling_json"); it != meta.end()) {
    input.rope_scaling_json = it->second;
  }
  for (auto& [name, tensor] : file->tensors) {
    RawTensor raw;
    raw.dtype = tensor.dtype;
    raw.shape = tensor.shape;
    raw.bytes = std::move(tensor.data);
    if (!absl::StartsWith(name, kProfilePrefix)) {
      input.tensors.emplace(name, std::move(raw));
      continue;
    }
    const std::string key = absl::StrCat(name, kManifestSuffix);
    auto manifest_text = meta.find(key);
    if (manifest_text == meta.end()) {
      return absl::DataLossError(absl::StrCat("__metadata__.", key, " is missing"));
    }
    auto manifest = ParseProfileManifest(manifest_text->second, absl::StrCat("__metadata__.", key));
    if (!manifest.ok()) return absl::DataLossError(manifest.status().message());
    ProfileInput profile;
    profile.ratios = std::move(raw);
    profile.metric = manifest->metric;
    profile.sink = manifest->sink;
    profile.window = manifest->window;
    input.profiles.emplace(name.substr(sizeof(kProfilePrefix) - 1), std::move(profile));
  }
  return contents;
}

}  // namespace kvtrim::service
