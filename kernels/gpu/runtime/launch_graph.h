// CUDA graphs for launch sequences that repeat: a layer's scorer, selection and copies are
// 3 to 10 launches whose host cost (a few µs each) is most of a small layer's time. A
// sequence seen twice with the same launch key is captured into a graph on its second run
// and replayed as one cudaGraphLaunch from the third on.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "absl/status/status.h"

namespace kvtrim::gpu {

/// Bytes that identify a launch sequence: every by-value kernel argument and every device
/// pointer the sequence passes. Two sequences with equal keys launch the same kernels with
/// the same arguments, so one may be replayed for the other.
class LaunchKey {
 public:
  /// Appends `value` (arithmetic, enum or pointer: no padding bytes).
  template <typename T>
  LaunchKey& Add(const T& value) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_pointer_v<T>,
                  "LaunchKey takes scalars; add a struct field by field");
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof value);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }
  /// A readable name of the sequence for diagnostics (not part of the key).
  void set_label(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }

 private:
  std::string bytes_;
  std::string label_;
};

/// What a LaunchGraphCache did so far (tests, benchmarks, GpuBackend totals).
struct LaunchGraphStats {
  int64_t direct = 0;     // sequences launched one call at a time (first sight, or no graph)
  int64_t captured = 0;   // sequences captured into a graph (their second sight)
  int64_t replayed = 0;   // sequences replayed from a graph
  int64_t fallbacks = 0;  // captures that failed: launched directly, the key never tried again
};

/// The graphs of one stream, keyed by LaunchKey, least recently used evicted past `capacity`.
/// Used by one thread at a time (its WorkerContext's).
class LaunchGraphCache {
 public:
  /// Keeps at most `capacity` graphs (0 turns graphs off: every sequence runs directly).
  explicit LaunchGraphCache(size_t capacity = 64) : capacity_(capacity) {}
  ~LaunchGraphCache();
  LaunchGraphCache(const LaunchGraphCache&) = delete;
  LaunchGraphCache& operator=(const LaunchGraphCache&) = delete;

  /// Runs the launch sequence `enqueue` issues on `stream`: directly the first time `key` is
  /// seen; captured into a graph (stream capture, thread-local mode) and launched the second
  /// time; replayed with one cudaGraphLaunch after that. `enqueue` must issue every launch on
  /// `stream` and make no synchronous CUDA call. Its errors come back as they are (a failed
  /// capture is abandoned first); a capture CUDA refuses falls back to direct launches.
  absl::Status Run(cudaStream_t stream, const LaunchKey& key,
                   const std::function<absl::Status()>& enqueue);

  /// True when KVTRIM_LAUNCH_GRAPH_CHECK is set: Run waits for each sequence and reports the
  /// first that fails on the device with its label and how it was issued (diagnostics).
  static bool Checking();

  /// Sets the capacity (0 = off), dropping graphs past it.
  void set_capacity(size_t capacity);
  size_t capacity() const { return capacity_; }
  /// The counts so far (any thread may read them while the owner runs).
  LaunchGraphStats stats() const;

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;       // null: seen once, or not capturable
    bool capturable = true;
    std::list<std::string>::iterator lru;  // position in lru_
  };
  /// Captures `enqueue` into entry->exec; false when CUDA refused the capture (the error
  /// of `enqueue` itself goes to *status).
  bool Capture(cudaStream_t stream, const std::function<absl::Status()>& enqueue, Entry* entry,
               absl::Status* status);
  /// Drops least recently used entries past the capacity (their graphs destroyed).
  void Evict();

  size_t capacity_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // most recent first
  size_t graphs_ = 0;           // entries holding an instantiated graph
  // LaunchGraphStats, written by the owner, read by anyone.
  std::atomic<int64_t> direct_{0}, captured_{0}, replayed_{0}, fallbacks_{0};
};

}  // namespace kvtrim::gpu
