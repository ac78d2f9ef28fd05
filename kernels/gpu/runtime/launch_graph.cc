#include "kernels/gpu/runtime/launch_graph.h"

#include <cstdio>
#include <cstdlib>

#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu {

LaunchGraphCache::~LaunchGraphCache() {
  // Destroying an executable graph lets its in-flight launches complete.
  for (auto& [key, entry] : entries_) {
    if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
  }
}

bool LaunchGraphCache::Checking() {
  static const bool check = std::getenv("KVTRIM_LAUNCH_GRAPH_CHECK") != nullptr;
  return check;
}

LaunchGraphStats LaunchGraphCache::stats() const {
  LaunchGraphStats stats;
  stats.direct = direct_.load(std::memory_order_relaxed);
  stats.captured = captured_.load(std::memory_order_relaxed);
  stats.replayed = replayed_.load(std::memory_order_relaxed);
  stats.fallbacks = fallbacks_.load(std::memory_order_relaxed);
  return stats;
}

void LaunchGraphCache::set_capacity(size_t capacity) {
  capacity_ = capacity;
  Evict();
}

void LaunchGraphCache::Evict() {
  // Graphs past the capacity: the least recently used go first.
  for (auto it = lru_.rbegin(); graphs_ > capacity_ && it != lru_.rend(); ++it) {
    Entry& entry = entries_.at(*it);
    if (entry.exec == nullptr) continue;
    cudaGraphExecDestroy(entry.exec);  // an in-flight launch still completes
    entry.exec = nullptr;
    --graphs_;
  }
  // Keys seen once are remembered too (the next sight captures them), up to 4 x capacity.
  while (entries_.size() > 4 * capacity_) {
    auto it = entries_.find(lru_.back());
    if (it->second.exec != nullptr) {
      cudaGraphExecDestroy(it->second.exec);
      --graphs_;
    }
    entries_.erase(it);
    lru_.pop_back();
  }
}

bool LaunchGraphCache::Capture(cudaStream_t stream,
                               const std::function<absl::Status()>& enqueue, Entry* entry,
                               absl::Status* status) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *status = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!status->ok() || ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // an invalidated capture is not a sticky error
    return status->ok() ? false : true;
  }
  const cudaError_t made = cudaGraphInstantiate(&entry->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    entry->exec = nullptr;
    cudaGetLastError();
    return false;
  }
  return true;
}

absl::Status LaunchGraphCache::Run(cudaStream_t stream, const LaunchKey& key,
                                   const std::function<absl::Status()>& enqueue) {
  if (capacity_ == 0) {
    ++direct_;
    return enqueue();
  }
  auto [it, inserted] = entries_.try_emplace(key.bytes());
  Entry& entry = it->second;
  if (inserted) {
    lru_.push_front(key.bytes());
  } else {
    lru_.splice(lru_.begin(), lru_, entry.lru);
  }
  entry.lru = lru_.begin();
  absl::Status status;
  const bool replayed = entry.exec != nullptr;
  if (replayed) {
    ++replayed_;
    status = CudaStatus(cudaGraphLaunch(entry.exec, stream), "cudaGraphLaunch");
  } else if (inserted || !entry.capturable) {
    ++direct_;
    status = enqueue();
  } else if (Capture(stream, enqueue, &entry, &status)) {
    if (status.ok()) {
      ++captured_;
      ++graphs_;
      status = CudaStatus(cudaGraphLaunch(entry.exec, stream), "cudaGraphLaunch");
    }
  } else {
    // CUDA refused the capture (an API this sequence uses cannot be captured): run it
    // directly, now and from now on.
    ++fallbacks_;
    entry.capturable = false;
    status = enqueue();
  }
  if (graphs_ > capacity_ || entries_.size() > 4 * capacity_) Evict();
  if (Checking() && status.ok()) {
    const cudaError_t done = cudaStreamSynchronize(stream);
    if (done != cudaSuccess) {
      std::fprintf(stderr, "launch graph check: %s after the %s sequence %s\n",
                   cudaGetErrorString(done),
                   entry.exec == nullptr ? "direct" : (replayed ? "replayed" : "captured"),
                   key.label().c_str());
    }
  }
  return status;
}

}  // namespace kvtrim::gpu
