#include "kernels/params.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"

namespace kvtrim {

ParamSpec ParamSpec::Int(std::string name, double def, double lo, double hi, std::string doc) {
  ParamSpec s;
  s.name = std::move(name);
  s.kind = Kind::kInt;
  s.default_number = def;
  s.min = lo;
  s.max = hi;
  s.description = std::move(doc);
  return s;
}

ParamSpec ParamSpec::Float(std::string name, double def, double lo, double hi, std::string doc) {
  ParamSpec s = Int(std::move(name), def, lo, hi, std::move(doc));
  s.kind = Kind::kFloat;
  return s;
}

ParamSpec ParamSpec::Bool(std::string name, bool def, std::string doc) {
  ParamSpec s = Int(std::move(name), def ? 1 : 0, 0, 1, std::move(doc));
  s.kind = Kind::kBool;
  return s;
}

ParamSpec ParamSpec::Enum(std::string name, std::string def, std::vector<std::string> choices,
                          std::string doc) {
  ParamSpec s;
  s.name = std::move(name);
  s.kind = Kind::kEnum;
  s.default_text = std::move(def);
  s.choices = std::move(choices);
  s.description = std::move(doc);
  return s;
}

namespace {

absl::Status CheckValue(const ParamSpec& spec, const ParamValue& value, const std::string& field) {
  if (spec.kind == ParamSpec::Kind::kEnum) {
    if (!value.is_text) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": expects one of {", absl::StrJoin(spec.choices, ", "), "}, got ",
          value.is_flag ? "a flag" : "a number"));
    }
    for (const auto& c : spec.choices) {
      if (c == value.text) return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", QuoteClientText(value.text),
                                                   " is not one of {",
                                                   absl::StrJoin(spec.choices, ", "), "}"));
  }
  if (value.is_text) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expects a number, got text ",
                                                   QuoteClientText(value.text)));
  }
  if (value.is_flag && spec.kind != ParamSpec::Kind::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expects ", spec.kind == ParamSpec::Kind::kInt ? "an integer" : "a number",
        ", got the flag ", value.number != 0 ? "true" : "false"));
  }
  const double v = value.number;
  if (std::isnan(v)) return absl::InvalidArgumentError(absl::StrCat(field, ": is NaN"));
  if (spec.kind == ParamSpec::Kind::kBool) {
    if (v != 0 && v != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expects a boolean (0 or 1), got ", ExactNumber(v)));
    }
    return absl::OkStatus();
  }
  if (spec.kind == ParamSpec::Kind::kInt && v != std::floor(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expects an integer, got ", ExactNumber(v)));
  }
  if (v < spec.min || v > spec.max) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", ExactNumber(v),
                                                   " is out of range [", ExactNumber(spec.min),
                                                   ", ", ExactNumber(spec.max), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedParams> ResolvedParams::Resolve(
    const std::vector<ParamSpec>& specs, const std::map<std::string, ParamValue>& overrides,
    const std::string& field_prefix) {
  ResolvedParams out;
  // An enum value keeps its choice's index in `number` (Choice, Enum).
  const auto choice_index = [](const ParamSpec& spec, const std::string& text) {
    const auto it = std::find(spec.choices.begin(), spec.choices.end(), text);
    return static_cast<double>(it - spec.choices.begin());
  };
  for (const auto& spec : specs) {
    if (spec.kind == ParamSpec::Kind::kEnum) {
      ParamValue value = ParamValue::Text(spec.default_text);
      value.number = choice_index(spec, spec.default_text);
      out.values_[spec.name] = value;
    } else {
      out.values_[spec.name] = ParamValue::Number(spec.default_number);
    }
  }
  for (const auto& [name, value] : overrides) {
    const std::string field = absl::StrCat(field_prefix, ".", ClientTextInField(name));
    const ParamSpec* spec = nullptr;
    for (const auto& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) {
      std::vector<std::string> known;
      for (const auto& s : specs) known.push_back(s.name);
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown parameter; this policy takes {", absl::StrJoin(known, ", "), "}"));
    }
    KVTRIM_RETURN_IF_ERROR(CheckValue(*spec, value, field));
    out.values_[name] = value;
    if (spec->kind == ParamSpec::Kind::kEnum) {
      out.values_[name].number = choice_index(*spec, value.text);
    }
  }
  return out;
}

double ResolvedParams::Number(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.is_text) {
    std::cerr << "kvtrim: internal error: numeric parameter '" << name << "' not declared\n";
    std::abort();
  }
  return it->second.number;
}

int ResolvedParams::Choice(const std::string& name) const {
  Text(name);  // aborts unless `name` is a declared enum parameter
  return static_cast<int>(values_.at(name).number);
}

const std::string& ResolvedParams::Text(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || !it->second.is_text) {
    std::cerr << "kvtrim: internal error: enum parameter '" << name << "' not declared\n";
    std::abort();
  }
  return it->second.text;
}

}  // namespace kvtrim
