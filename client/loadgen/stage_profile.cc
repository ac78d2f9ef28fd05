#include "client/loadgen/stage_profile.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace kvtrim::loadgen {
namespace {

/// A LayerProfile field: the stage's name, where it is measured and its accessor.
struct StageField {
  const char* name;
  const char* where;
  double (v1::LayerProfile::*get)() const;
};

// In the order a layer passes them; "server" is the whole of them and "outside_server" is
// computed from the round trip.
constexpr StageField kFields[] = {
    {"decode", "host", &v1::LayerProfile::decode_seconds},
    {"validate", "host", &v1::LayerProfile::validate_seconds},
    {"queued", "host", &v1::LayerProfile::queued_seconds},
    {"worker_wait", "host", &v1::LayerProfile::worker_wait_seconds},
    {"plan", "host", &v1::LayerProfile::plan_seconds},
    {"stage", "host", &v1::LayerProfile::stage_seconds},
    {"ready_wait", "device", &v1::LayerProfile::ready_wait_seconds},
    {"stage_device", "device", &v1::LayerProfile::stage_device_seconds},
    {"score", "device", &v1::LayerProfile::score_seconds},
    {"select", "device", &v1::LayerProfile::select_seconds},
    {"perturbation", "device", &v1::LayerProfile::perturbation_seconds},
    {"download", "device", &v1::LayerProfile::download_seconds},
    {"fetch", "host", &v1::LayerProfile::fetch_seconds},
    {"encode", "host", &v1::LayerProfile::encode_seconds},
    {"server", "host", &v1::LayerProfile::server_seconds},
};

}  // namespace

StageProfile::StageProfile() {
  for (const StageField& field : kFields) stages_.push_back({field.name, field.where, {}});
  stages_.push_back({"outside_server", "client", {}});
}

void StageProfile::Add(const v1::LayerProfile& profile, double round_trip_s) {
  size_t i = 0;
  for (const StageField& field : kFields) stages_[i++].seconds.push_back((profile.*field.get)());
  stages_[i].seconds.push_back(std::max(0.0, round_trip_s - profile.server_seconds()));
}

void StageProfile::Merge(const StageProfile& other) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    const std::vector<double>& more = other.stages_[i].seconds;
    stages_[i].seconds.insert(stages_[i].seconds.end(), more.begin(), more.end());
  }
}

nlohmann::json StageProfile::Json() const {
  nlohmann::json stages = nlohmann::json::object();
  nlohmann::json order = nlohmann::json::array();
  for (const StageSamples& stage : stages_) {
    const Summary s = Summarize(stage.seconds);
    stages[stage.name] = {{"where", stage.where}, {"count", s.count}, {"mean", s.mean},
                          {"p50", s.p50},         {"p99", s.p99},     {"min", s.min},
                          {"max", s.max}};
    order.push_back(stage.name);
  }
  return {{"order", order}, {"stages", stages}};
}

std::string StageProfile::Table() const {
  std::string out = absl::StrFormat("  %-16s %-7s %10s %10s\n", "stage (µs)", "where", "p50",
                                    "p99");
  for (const StageSamples& stage : stages_) {
    const Summary s = Summarize(stage.seconds);
    out += absl::StrFormat("  %-16s %-7s %10.1f %10.1f\n", stage.name, stage.where, s.p50 * 1e6,
                           s.p99 * 1e6);
  }
  return out;
}

}  // namespace kvtrim::loadgen
