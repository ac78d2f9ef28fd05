#include "kernels/scorer_params.h"

namespace kvtrim {

namespace {

/// A choice list built once and never destroyed (read from any thread).
const std::vector<std::string>& Choices(std::initializer_list<const char*> names) {
  return *new std::vector<std::string>(names.begin(), names.end());
}

}  // namespace

const std::vector<std::string>& PoolKindChoices() {
  static const std::vector<std::string>& choices = Choices({"max", "avg"});
  return choices;
}

const std::vector<std::string>& KeyDiffAnchorChoices() {
  static const std::vector<std::string>& choices = Choices({"normalized_mean", "raw_mean"});
  return choices;
}

const std::vector<std::string>& Bf16ProbRoundChoices() {
  static const std::vector<std::string>& choices = Choices({"auto", "on", "off"});
  return choices;
}

const std::vector<std::string>& CriticalKVNormChoices() {
  static const std::vector<std::string>& choices = Choices({"l1", "l2"});
  return choices;
}

const std::vector<std::string>& LaProxModeChoices() {
  static const std::vector<std::string>& choices =
      Choices({"model", "model_raw", "layer", "local"});
  return choices;
}

const std::vector<std::string>& LaProxGqaChoices() {
  static const std::vector<std::string>& choices = Choices({"mean", "head_bound", "summed_wo"});
  return choices;
}

const std::vector<std::string>& QueryStatsSourceChoices() {
  static const std::vector<std::string>& choices = Choices({"auto", "model", "window"});
  return choices;
}

WindowPooling ReadWindowPooling(const ResolvedParams& params) {
  WindowPooling out;
  out.window = params.Int("window");
  out.kernel = params.Int("kernel");
  out.pooling = params.Enum<PoolKind>("pooling");
  return out;
}

}  // namespace kvtrim
