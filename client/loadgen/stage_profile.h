// The per-stage profile of the load generator's layers: kvtrimd's LayerResult.profile of
// every measured layer (CompressionSettings.profile) summarised stage by stage, plus the time
// a layer spent outside the server (its round trip minus the server's own time).
#pragma once

#include <string>
#include <vector>

#include "client/loadgen/stats.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "nlohmann/json.hpp"

namespace kvtrim::loadgen {

/// One stage's samples over every measured layer.
struct StageSamples {
  std::string name;         // "decode", "score", ... (LayerProfile's field without _seconds)
  std::string where;        // "host", "device" or "client"
  std::vector<double> seconds;
};

/// The stages in the order a layer passes them, each with its samples, collected layer by
/// layer with Add.
class StageProfile {
 public:
  StageProfile();
  /// Adds one layer: its profile and its round trip as the client saw it (send -> answer).
  void Add(const v1::LayerProfile& profile, double round_trip_s);
  /// Appends every layer of `other`.
  void Merge(const StageProfile& other);
  /// Layers added.
  size_t layers() const { return stages_.empty() ? 0 : stages_.front().seconds.size(); }
  /// The stages with their samples.
  const std::vector<StageSamples>& stages() const { return stages_; }

  /// {stage: {where, count, mean, p50, p99, min, max}} in seconds (JSON object in stage order
  /// is not guaranteed; "order" lists the names).
  nlohmann::json Json() const;
  /// A table of the p50 / p99 per stage in microseconds, one line each.
  std::string Table() const;

 private:
  std::vector<StageSamples> stages_;
};

}  // namespace kvtrim::loadgen
