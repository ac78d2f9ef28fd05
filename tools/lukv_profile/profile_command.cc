#include "tools/lukv_profile/profile_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/commands.h"
#include "client/cli/flag_parse.h"
#include "client/cli/param_parse.h"
#include "tools/lukv_profile/profile_io.h"
#include "kernels/lukv/greedy_solver.h"
#include "kernels/registry.h"

ABSL_FLAG(std::string, model, "",
          "profile: model bundle .safetensors (client/model_bundle.h); the profiler reads its "
          "layers.{l}.w_o [D, H_q*d] and layout metadata");
ABSL_FLAG(std::string, param, "", "profile: the scorer's parameter overrides, name=value,...");
ABSL_FLAG(std::string, metric, "", "profile: the wrapped scorer, e.g. snapkv");
ABSL_FLAG(std::string, dumps, "",
          "profile: comma-separated calibration dumps (.safetensors), one per question");
ABSL_FLAG(std::string, out, "",
          "profile: output PROFILE.npy ([99, L, H_kv] float32); the manifest goes to "
          "PROFILE.npy.json");
ABSL_FLAG(int64_t, sink, 4, "profile: protected first tokens (ranked first by π)");
ABSL_FLAG(int64_t, window, 32,
          "profile: protected last tokens, and the scorer's observation window (query rows "
          "T-window..T-1) unless --param sets window");
ABSL_FLAG(int64_t, k_max, 128, "profile: decode steps (answer tokens) the oracle reads");
ABSL_FLAG(std::string, gqa_agg, "mean",
          "profile: how the query heads of a KV head combine in the oracle: mean, sum or max");
ABSL_FLAG(int32_t, threads, 1, "profile: CPU threads for scoring and the oracle");

namespace kvtrim::lukv_profile {

using cli::FlagsHelp;
using cli::kExitOk;
using cli::kExitRpcError;
using cli::kExitUsage;
using cli::ParseParams;

namespace {

/// Converts the CLI's parsed proto parameter values to the kernels' ParamValue.
absl::StatusOr<std::map<std::string, ParamValue>> KernelParams(const std::string& text) {
  auto parsed = ParseParams(text);
  if (!parsed.ok()) return parsed.status();
  std::map<std::string, ParamValue> out;
  for (const auto& [name, value] : *parsed) {
    switch (value.value_case()) {
      case v1::ParamValue::kNumber: out[name] = ParamValue::Number(value.number()); break;
      case v1::ParamValue::kText: out[name] = ParamValue::Text(value.text()); break;
      case v1::ParamValue::kFlag: out[name] = ParamValue::Flag(value.flag()); break;
      default: break;
    }
  }
  return out;
}

/// "[#####.....] 12/40 layers  3.1 s" redrawn in place with '\r'.
class ProgressBar {
 public:
  ProgressBar(std::ostream* out, int64_t total)
      : out_(out), total_(total), start_(std::chrono::steady_clock::now()) {}
  void Step() {
    ++done_;
    if (out_ == nullptr) return;
    constexpr int64_t kWidth = 20;
    const int64_t filled = total_ > 0 ? done_ * kWidth / total_ : kWidth;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    *out_ << absl::StrFormat("\r[%s%s] %d/%d layers  %.1f s", std::string(filled, '#'),
                             std::string(kWidth - filled, '.'), done_, total_, seconds);
    if (done_ == total_) *out_ << "\n";
    out_->flush();
  }

 private:
  std::ostream* out_;
  int64_t total_;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

ProfileCommandOptions ProfileOptionsFromFlags() {
  ProfileCommandOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.metric = absl::GetFlag(FLAGS_metric);
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_dumps), ',', absl::SkipEmpty())) {
    o.dumps.emplace_back(p);
  }
  o.out = absl::GetFlag(FLAGS_out);
  o.params = absl::GetFlag(FLAGS_param);
  o.sink = absl::GetFlag(FLAGS_sink);
  o.window = absl::GetFlag(FLAGS_window);
  o.k_max = absl::GetFlag(FLAGS_k_max);
  o.gqa_agg = absl::GetFlag(FLAGS_gqa_agg);
  o.threads = absl::GetFlag(FLAGS_threads);
  return o;
}

std::string ProfileHelp() {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  std::vector<std::string> metrics, unsupported;
  for (const ScorerSpec* s : registry.scorers()) {
    (s->required_inputs & (kInputModel | kInputProfile) ? unsupported : metrics)
        .push_back(s->name);
  }
  return absl::StrCat(
      "kvtrim-lukv-profile (runs locally, no server): LU-KV offline profiling. Reads --model's\n"
      "  W_O and the --dumps, ranks each head's context with the CPU scorer --metric (sink and\n"
      "  window tokens first), scores tokens with the oracle max_k A·||v W_O||_2 over the answer's\n"
      "  decode steps, solves the greedy allocation per dump and writes the mean local ratios\n"
      "  Φ [99, L, H_kv] to --out (.npy) and --out.json. Scorer parameters: --param.\n"
      "  Supported metrics (scorers that need no registered model):\n    ",
      absl::StrJoin(metrics, ", "),
      ".\n  Not supported: scorers that read a registered model (W_O or query statistics):\n"
      "    ",
      absl::StrJoin(unsupported, ", "), ".\n\nflags:\n",
      FlagsHelp("tools/lukv_profile/profile_command.cc"));
}

absl::StatusOr<NpyArray> BuildProfile(const ProfileCommandOptions& options,
                                            std::unique_ptr<lukv::ProfileBuilder>* builder,
                                            std::ostream* progress) {
  if (options.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (options.metric.empty()) return absl::InvalidArgumentError("--metric is required");
  if (options.dumps.empty()) return absl::InvalidArgumentError("--dumps is required");
  if (options.threads < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  lukv::ProfileConfig config;
  config.metric = options.metric;
  auto params = KernelParams(options.params);
  if (!params.ok()) return params.status();
  config.params = *std::move(params);
  config.sink = options.sink;
  config.window = options.window;
  config.oracle.k_max = options.k_max;
  auto agg = lukv::ParseGqaAggregation(options.gqa_agg);
  if (!agg.ok()) return agg.status();
  config.oracle.gqa = *agg;
  config.num_threads = options.threads;
  auto model = ReadModelWeights(options.model);
  if (!model.ok()) return model.status();
  const int64_t L = model->num_layers, H = model->num_kv_heads;
  auto created = lukv::ProfileBuilder::Create(std::move(config), *std::move(model));
  if (!created.ok()) return created.status();
  *builder = *std::move(created);
  ProgressBar bar(progress, static_cast<int64_t>(options.dumps.size()) * L);
  for (const std::string& path : options.dumps) {
    auto dump = ReadCalibrationDump(path);  // one dump in memory at a time
    if (!dump.ok()) return dump.status();
    if (auto st = (*builder)->AddDump(*dump, [&](int64_t) { bar.Step(); }); !st.ok()) return st;
  }
  auto phi = (*builder)->Profile();
  if (!phi.ok()) return phi.status();
  return NpyArray{{lukv::kGridRows, L, H}, *std::move(phi)};
}

int RunProfile(const ProfileCommandOptions& options, std::ostream& out, std::ostream& err) {
  for (const auto& [flag, missing] :
       {std::pair<const char*, bool>{"--model", options.model.empty()},
        {"--metric", options.metric.empty()},
        {"--dumps", options.dumps.empty()},
        {"--out", options.out.empty()}}) {
    if (missing) {
      err << "usage error: profile: " << flag
          << " is required\nrun 'kvtrim-lukv-profile --help' for usage\n";
      return kExitUsage;
    }
  }
  std::unique_ptr<lukv::ProfileBuilder> builder;
  const auto start = std::chrono::steady_clock::now();
  auto profile = BuildProfile(options, &builder, &err);
  if (!profile.ok()) {  // the progress bar may have left its line open
    err << "\nerror: profile: " << profile.status().message() << "\n";
    return kExitUsage;
  }
  if (auto st = WriteProfile(options.out, *builder, *profile, options.dumps); !st.ok()) {
    err << "error: profile: " << st.message() << "\n";
    return kExitRpcError;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out << absl::StrFormat("wrote %s [%s] float32 and %s.json (metric=%s sink=%d window=%d "
                         "M=%d) in %.1f s\nsha256 %s\n",
                         options.out, absl::StrJoin(profile->shape, ", "), options.out,
                         options.metric, options.sink, options.window, builder->num_dumps(),
                         seconds, Sha256Hex(NpyDataBytes(*profile)));
  // Spread of the local ratios at a few global ratios.
  const int64_t heads = profile->shape[1] * profile->shape[2];
  for (double rho : {0.5, 0.8, 0.9}) {
    const int row = static_cast<int>(std::lround(rho * 100)) - 1;
    const float* r = profile->data.data() + row * heads;
    const auto [lo, hi] = std::minmax_element(r, r + heads);
    out << absl::StrFormat("  global ratio %.2f: local ratios in [%.3f, %.3f]\n", rho, *lo, *hi);
  }
  return kExitOk;
}

}  // namespace kvtrim::lukv_profile
