// The registry of models kvtrimd serves: digest -> immutable RegisteredModel, persisted one
// file per model under --data_dir so that a restart (or a replica sharing the volume) keeps
// them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/model.h"

namespace kvtrim::service {

/// Limits and location of a ModelStore.
struct ModelStoreOptions {
  /// Directory of the model files ("<hex>.kvtmodel"); empty = in memory only (models are
  /// lost on restart).
  std::string data_dir;
  /// Most models held at once; Add beyond it is RESOURCE_EXHAUSTED.
  int max_models = 16;
  /// Largest registration (sum of its weights' bytes) the RegisterModel stream accepts.
  int64_t max_model_bytes = int64_t{16} << 30;
};

/// Thread-safe map digest -> shared immutable model. Find is cheap (a shared_ptr copy under
/// a mutex); Add digests, builds and persists outside the lock.
/// A model deleted while a request uses it stays alive until that request ends.
class ModelStore {
 public:
  /// `error_log` receives one line per model file skipped at LoadAll and per file that
  /// could not be removed; it must outlive the store.
  ModelStore(ModelStoreOptions options, std::ostream& error_log);

  /// Creates data_dir when missing and loads every "*.kvtmodel" in it. A file that is
  /// corrupt, truncated, not a model file, or whose recomputed digest differs from the one
  /// it stores or from its file name is skipped with one line
  /// "kvtrimd: skipping model file PATH: WHY" on the error log; the rest load. Leftover
  /// "*.kvtmodel.tmp" files (a crash mid-write) are removed. Returns how many models were
  /// loaded; FAILED_PRECONDITION naming --data_dir when the directory cannot be created or
  /// listed. With an empty data_dir: 0.
  absl::StatusOr<int> LoadAll();

  /// The model with `digest`, or null.
  std::shared_ptr<const RegisteredModel> Find(const std::string& digest) const;

  /// Find, and when the model is not held but data_dir has its file (written by another
  /// kvtrimd sharing the volume, e.g. a replica behind the same Service), loads that file,
  /// checked as at LoadAll, and holds it from then on; concurrent calls load it once. Null
  /// when neither has it, when the store already holds --max_models models, or when the
  /// file is invalid (one line on the error log). Reads the whole file on a miss, so
  /// callers run it off gRPC's threads.
  std::shared_ptr<const RegisteredModel> FindOrLoad(const std::string& digest);

  /// Validates `input` (BuildModel: INVALID_ARGUMENT naming the field), computes its
  /// digest and, unless a model with that digest is already held (then it returns that
  /// digest and writes nothing), persists it and adds it. A registration alone builds
  /// beside the digest and persists beside the build; with others in flight it builds only
  /// once admitted (identical content built once). An invalid model is not left on disk. RESOURCE_EXHAUSTED naming
  /// --max_models when the store is full; INTERNAL / RESOURCE_EXHAUSTED (disk full) when
  /// the file cannot be written (the model is then not added).
  absl::StatusOr<std::string> Add(ModelInput input);

  /// Removes the model and its file. INVALID_ARGUMENT naming `digest` when it is not
  /// "sha256:<64 hex>", NOT_FOUND naming `digest` when no such model is held; INTERNAL when
  /// the file cannot be removed (the model is then kept).
  absl::Status Delete(const std::string& digest);

  /// Every model, in digest order.
  std::vector<std::shared_ptr<const RegisteredModel>> List() const;

  /// Models held.
  size_t size() const;

  const ModelStoreOptions& options() const { return options_; }

  /// The file of `digest` under data_dir ("" when in memory only).
  std::string PathFor(const std::string& digest) const;

 private:
  /// Reads, validates and digests one file; the model or why it was skipped.
  absl::StatusOr<std::shared_ptr<RegisteredModel>> LoadFile(const std::string& path,
                                                            const std::string& hex) const;
  /// Rewrites the file at `path`, which stores `model` under its v1 (legacy) digest, as the
  /// file of its v2 digest and removes the old one; logs what it did.
  void MigrateLegacyFile(const std::string& path, const RegisteredModel& model) const;

  const ModelStoreOptions options_;
  std::ostream& error_log_;
  mutable std::mutex mutex_;          // guards models_ and pending_
  std::condition_variable settled_;   // signalled when a pending Add ends
  std::map<std::string, std::shared_ptr<const RegisteredModel>> models_;
  std::set<std::string> pending_;     // digests being written by Add or read by FindOrLoad
  int adding_ = 0;                    // Add calls in flight
};

}  // namespace kvtrim::service
