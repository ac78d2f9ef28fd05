#include "kernels/bench/gpu_bench_options.h"

#include <algorithm>
#include <iostream>
#include <optional>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace kvtrim::gpu::bench {
namespace {

/// Parses "a,b,c" of positive integers; false when empty or malformed.
bool ParseIntList(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) return false;
    out->push_back(v);
  }
  return !out->empty();
}

/// Parses "bf16,f16,f32" (any subset, in order); `allow_empty` admits "" (no dtype).
bool ParseDTypeList(const std::string& text, bool allow_empty, std::vector<DType>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if (part == "bf16") {
      out->push_back(DType::kBF16);
    } else if (part == "f16") {
      out->push_back(DType::kF16);
    } else if (part == "f32") {
      out->push_back(DType::kF32);
    } else {
      return false;
    }
  }
  return allow_empty || !out->empty();
}

/// Parses "fast,exact" (any subset, in order); false when empty or malformed.
bool ParseNumericsList(const std::string& text, std::vector<Numerics>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::optional<Numerics> mode = ParseNumerics(std::string_view(part.data(), part.size()));
    if (!mode.has_value()) return false;
    out->push_back(*mode);
  }
  return !out->empty();
}

/// Parses a boolean flag value: "" (bare flag), "1", "true", "0", "false".
bool ParseBool(const std::string& text, bool* out) {
  if (text.empty() || text == "1" || text == "true") {
    *out = true;
  } else if (text == "0" || text == "false") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = eq != std::string::npos;
    if (name == "--out") {
      o->out_dir = value;
    } else if (name == "--reps") {
      ok = ok && absl::SimpleAtoi(value, &o->reps) && o->reps >= 20;
    } else if (name == "--warmup") {
      ok = ok && absl::SimpleAtoi(value, &o->warmup) && o->warmup >= 1;
    } else if (name == "--n") {
      ok = ok && ParseIntList(value, &o->ns);
    } else if (name == "--w") {
      ok = ok && ParseIntList(value, &o->windows);
    } else if (name == "--policies") {
      o->policies = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (name == "--copy_mib") {
      ok = ok && absl::SimpleAtoi(value, &o->copy_mib) && o->copy_mib >= 1024;
    } else if (name == "--model_n") {
      ok = ok && ParseIntList(value, &o->model_ns);
    } else if (name == "--hidden") {
      ok = ok && absl::SimpleAtoi(value, &o->hidden) && o->hidden >= 1;
    } else if (name == "--host_reps") {
      ok = ok && absl::SimpleAtoi(value, &o->host_reps) && o->host_reps >= 1;
    } else if (name == "--numerics") {
      ok = ok && ParseNumericsList(value, &o->numerics);
    } else if (name == "--dtypes") {
      ok = ok && ParseDTypeList(value, /*allow_empty=*/false, &o->dtypes);
    } else if (name == "--extra_dtypes") {
      ok = ok && ParseDTypeList(value, /*allow_empty=*/true, &o->extra_dtypes);
    } else if (name == "--extra_dtypes_n") {
      ok = ok && (value.empty() ? (o->extra_dtypes_n.clear(), true)
                                : ParseIntList(value, &o->extra_dtypes_n));
    } else if (name == "--stages") {
      ok = ParseBool(value, &o->stages);
    } else if (name == "--stage_reps") {
      ok = ok && absl::SimpleAtoi(value, &o->stage_reps) && o->stage_reps >= 1;
    } else if (name == "--graphs") {
      ok = ParseBool(value, &o->graphs);
    } else if (name == "--compare_direct") {
      ok = ParseBool(value, &o->compare_direct);
    } else {
      ok = false;
    }
    if (!ok) {
      std::cerr << "kvtrim_gpu_bench: bad flag '" << arg
                << "' (--out=DIR --reps>=20 --warmup>=1 --n=LIST --w=LIST --policies=LIST "
                   "--copy_mib>=1024 --model_n=LIST --hidden>=1 --host_reps>=1 "
                   "--numerics=fast,exact --dtypes=bf16[,f16,f32] --extra_dtypes=LIST "
                   "--extra_dtypes_n=LIST --stages[=0|1] --stage_reps>=1 --graphs[=0|1] "
                   "--compare_direct[=0|1])\n";
      return false;
    }
  }
  return true;
}

std::vector<DType> DTypesAt(const Options& options, int64_t n) {
  std::vector<DType> out = options.dtypes;
  const bool extra = std::find(options.extra_dtypes_n.begin(), options.extra_dtypes_n.end(), n) !=
                     options.extra_dtypes_n.end();
  if (extra) {
    for (DType d : options.extra_dtypes) {
      if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
    }
  }
  return out;
}

}  // namespace kvtrim::gpu::bench
