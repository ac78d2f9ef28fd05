#include "service/model_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <system_error>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/client_text.h"
#include "service/model_digest.h"
#include "service/model_file.h"

namespace kvtrim::service {

namespace fs = std::filesystem;

ModelStore::ModelStore(ModelStoreOptions options, std::ostream& error_log)
    : options_(std::move(options)), error_log_(error_log) {}

std::string ModelStore::PathFor(const std::string& digest) const {
  if (options_.data_dir.empty()) return "";
  return (fs::path(options_.data_dir) / absl::StrCat(DigestHex(digest), kModelFileSuffix))
      .string();
}

absl::StatusOr<std::shared_ptr<RegisteredModel>> ModelStore::LoadFile(
    const std::string& path, const std::string& hex) const {
  // The weights and the file's header (names, shapes, metadata; far below 16 MiB).
  auto contents = ReadModelFile(path, options_.max_model_bytes + (int64_t{16} << 20));
  if (!contents.ok()) return contents.status();
  const std::string expected = absl::StrCat(kDigestPrefix, hex);
  if (contents->stored_digest != expected) {
    return absl::DataLossError(absl::StrCat("the digest it stores (", contents->stored_digest,
                                            ") does not match its file name"));
  }
  const std::string digest = ComputeModelDigest(contents->input);
  const bool legacy = digest != expected && ComputeLegacyModelDigest(contents->input) == expected;
  if (digest != expected && !legacy) {
    return absl::DataLossError(absl::StrCat("its content hashes to ", digest,
                                            ", not to the digest it stores (", expected,
                                            "): the file is corrupt"));
  }
  auto model = BuildModel(std::move(contents->input));
  if (!model.ok()) {
    return absl::DataLossError(absl::StrCat("invalid model: ", model.status().message()));
  }
  (*model)->digest = digest;
  if (legacy) MigrateLegacyFile(path, **model);
  return *std::move(model);
}

void ModelStore::MigrateLegacyFile(const std::string& path, const RegisteredModel& model) const {
  const std::string renamed = PathFor(model.digest);
  std::error_code ignored;
  // The same content registered again after an upgrade already has its v2 file.
  absl::Status written = fs::exists(renamed, ignored)
                             ? absl::OkStatus()
                             : WriteModelFile(renamed, model.input, model.digest);
  if (!written.ok()) {
    error_log_ << "kvtrimd: model file " << path << " has a v1 digest; serving it as "
               << model.digest << ", but rewriting it failed (" << written.message()
               << "); it is migrated at the next start" << std::endl;
    return;
  }
  fs::remove(path, ignored);
  error_log_ << "kvtrimd: model file " << path << " had a v1 digest; now " << renamed
             << " (" << model.digest << "); clients holding the old digest re-register"
             << std::endl;
}

absl::StatusOr<int> ModelStore::LoadAll() {
  if (options_.data_dir.empty()) return 0;
  std::error_code ec;
  fs::create_directories(options_.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_dir: cannot create '", options_.data_dir, "': ", ec.message()));
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(options_.data_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    files.push_back(it->path());
  }
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_dir: cannot list '", options_.data_dir, "': ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  const std::string suffix = kModelFileSuffix;
  const std::string tmp_suffix = suffix + ".tmp";
  int loaded = 0;
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    if (absl::EndsWith(name, tmp_suffix)) {
      // A write that never reached its rename: never a complete model.
      fs::remove(file, ec);
      error_log_ << "kvtrimd: removed unfinished model file " << file.string() << std::endl;
      continue;
    }
    if (!absl::EndsWith(name, suffix)) continue;
    const std::string hex = name.substr(0, name.size() - suffix.size());
    absl::StatusOr<std::shared_ptr<RegisteredModel>> model =
        IsWellFormedDigest(absl::StrCat(kDigestPrefix, hex))
            ? LoadFile(file.string(), hex)
            : absl::DataLossError("the file name is not <64 lower-case hex digits>.kvtmodel");
    if (!model.ok()) {
      error_log_ << "kvtrimd: skipping model file " << file.string() << ": "
                 << model.status().message() << std::endl;
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    models_[(*model)->digest] = *std::move(model);
    ++loaded;
  }
  if (loaded > options_.max_models) {
    error_log_ << "kvtrimd: " << loaded << " models loaded from " << options_.data_dir
               << " exceed --max_models=" << options_.max_models
               << "; all are served, new registrations are refused until some are deleted"
               << std::endl;
  }
  return loaded;
}

std::shared_ptr<const RegisteredModel> ModelStore::Find(const std::string& digest) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = models_.find(digest);
  return it == models_.end() ? nullptr : it->second;
}

std::shared_ptr<const RegisteredModel> ModelStore::FindOrLoad(const std::string& digest) {
  if (auto held = Find(digest)) return held;
  if (options_.data_dir.empty() || !IsWellFormedDigest(digest)) return nullptr;
  const std::string path = PathFor(digest);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return nullptr;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // An Add or a load of the same digest in flight: wait for it and take its model.
    settled_.wait(lock, [&] { return pending_.count(digest) == 0; });
    if (auto it = models_.find(digest); it != models_.end()) return it->second;
    if (models_.size() + pending_.size() >= static_cast<size_t>(options_.max_models)) {
      error_log_ << "kvtrimd: not loading model file " << path << ": --max_models="
                 << options_.max_models << " models are held" << std::endl;
      return nullptr;
    }
    pending_.insert(digest);
  }
  absl::StatusOr<std::shared_ptr<RegisteredModel>> model = LoadFile(path, DigestHex(digest));
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(digest);
  settled_.notify_all();
  if (!model.ok()) {
    error_log_ << "kvtrimd: skipping model file " << path << ": " << model.status().message()
               << std::endl;
    return nullptr;
  }
  error_log_ << "kvtrimd: model " << digest << " loaded from " << path
             << " (registered through another kvtrimd sharing --data_dir)" << std::endl;
  return models_[digest] = *std::move(model);
}

absl::StatusOr<std::string> ModelStore::Add(ModelInput input) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  };
  const auto start = Clock::now();
  // Alone, the build (the Gram matrices) starts beside the digest and the file is written
  // beside the rest of the build: all three only read `input`. With other registrations in
  // flight (workers registering one model together), the build waits for the admission
  // below so that identical content is built once.
  bool alone = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    alone = adding_ == 0;
    ++adding_;
  }
  absl::Cleanup leave = [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    --adding_;
  };
  // A std::async future waits for its task when destroyed: every path out waits for a build
  // still reading `input` (a parameter, destroyed after it).
  std::future<absl::StatusOr<std::shared_ptr<RegisteredModel>>> build;
  const auto start_build = [&] {
    build = std::async(std::launch::async, [&input] { return BuildModelFrom(input); });
  };
  if (alone) start_build();
  const std::string digest = ComputeModelDigest(input);
  const auto digested = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // A concurrent Add of the same content: wait for it, then answer as for a known model.
    settled_.wait(lock, [&] { return pending_.count(digest) == 0; });
    if (models_.count(digest) != 0) return digest;
    if (models_.size() + pending_.size() >= static_cast<size_t>(options_.max_models)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "--max_models: the server already holds ", models_.size(),
          " models (limit ", options_.max_models, "); delete one with DeleteModel first"));
    }
    pending_.insert(digest);
  }
  if (!build.valid()) start_build();
  absl::Status status;
  if (!options_.data_dir.empty()) status = WriteModelFile(PathFor(digest), input, digest);
  const auto persisted = Clock::now();
  absl::StatusOr<std::shared_ptr<RegisteredModel>> model = build.get();
  const auto built = Clock::now();
  if (!model.ok()) {
    // An invalid model is neither held nor left on disk.
    if (status.ok() && !options_.data_dir.empty()) {
      std::error_code ignored;
      std::filesystem::remove(PathFor(digest), ignored);
    }
    status = model.status();
  }
  if (status.ok()) {
    (*model)->digest = digest;
    (*model)->input = std::move(input);
    // Where a registration's time went (operators size --max_model_bytes and timeouts by it).
    error_log_ << "kvtrimd: model " << digest << " stored in " << seconds(start, built)
               << " s: digest " << seconds(start, digested) << " s, persist "
               << seconds(digested, persisted) << " s, build done at " << seconds(start, built)
               << " s (" << (alone ? "beside the digest" : "after it") << ")" << std::endl;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(digest);
  if (status.ok()) models_[digest] = *std::move(model);
  settled_.notify_all();
  if (!status.ok()) return status;
  return digest;
}

absl::Status ModelStore::Delete(const std::string& digest) {
  if (digest.empty()) {
    return absl::InvalidArgumentError("digest: required; name the model to delete (ListModels)");
  }
  if (!IsWellFormedDigest(digest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "digest: ", QuoteClientText(digest), " is not sha256:<64 lower-case hex digits>"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = models_.find(digest);
  if (it == models_.end()) {
    return absl::NotFoundError(
        absl::StrCat("digest: no model '", digest, "' is registered (see ListModels)"));
  }
  if (!options_.data_dir.empty()) {
    const std::string path = PathFor(digest);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("digest: cannot remove the model file ", path,
                                              ": ", std::strerror(errno),
                                              "; the model stays registered"));
    }
  }
  models_.erase(it);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<const RegisteredModel>> ModelStore::List() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<const RegisteredModel>> out;
  out.reserve(models_.size());
  for (const auto& [digest, model] : models_) out.push_back(model);
  return out;
}

size_t ModelStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return models_.size();
}

}  // namespace kvtrim::service
