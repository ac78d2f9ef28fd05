// Policy parameters: their declarations (name, kind, default, range) and resolved values.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtrim {

/// Declares one tunable parameter of a scorer or allocator.
struct ParamSpec {
  enum class Kind { kInt, kFloat, kBool, kEnum };
  std::string name;
  Kind kind = Kind::kFloat;
  std::string description;
  double default_number = 0;          // default for kInt / kFloat / kBool (0 or 1)
  std::string default_text;           // default for kEnum
  double min = 0;                     // inclusive bounds for kInt / kFloat
  double max = 0;
  std::vector<std::string> choices;   // allowed values for kEnum

  static ParamSpec Int(std::string name, double def, double lo, double hi, std::string doc);
  static ParamSpec Float(std::string name, double def, double lo, double hi, std::string doc);
  static ParamSpec Bool(std::string name, bool def, std::string doc);
  static ParamSpec Enum(std::string name, std::string def, std::vector<std::string> choices,
                        std::string doc);
};

/// A parameter value as a client sends it: a number (ints, floats, bools), a text (enums) or
/// a flag (bools only).
struct ParamValue {
  bool is_text = false;
  double number = 0;
  std::string text;

  bool is_flag = false;  // given as a boolean (ParamValue.flag): taken by boolean parameters only

  static ParamValue Number(double v) { return ParamValue{false, v, {}, false}; }
  static ParamValue Text(std::string v) { return ParamValue{true, 0, std::move(v), false}; }
  static ParamValue Flag(bool v) { return ParamValue{false, v ? 1.0 : 0.0, {}, true}; }
};

/// The full set of parameter values of one policy after defaults and overrides are merged
/// and validated. Lookups of undeclared names are programming errors (they abort).
class ResolvedParams {
 public:
  /// Merges `overrides` over the defaults of `specs`. Errors (INVALID_ARGUMENT) name the
  /// parameter as "<field_prefix>.<name>": unknown name, wrong kind, value out of range,
  /// non-integer for an int, unknown enum choice, NaN.
  static absl::StatusOr<ResolvedParams> Resolve(const std::vector<ParamSpec>& specs,
                                                const std::map<std::string, ParamValue>& overrides,
                                                const std::string& field_prefix);

  double Number(const std::string& name) const;
  int64_t Int(const std::string& name) const { return static_cast<int64_t>(Number(name)); }
  bool Bool(const std::string& name) const { return Number(name) != 0; }
  const std::string& Text(const std::string& name) const;
  /// The index of an enum parameter's value among its declared choices (ParamSpec::choices).
  int Choice(const std::string& name) const;
  /// An enum parameter as the typed enum E whose enumerators list its choices in order
  /// (kernels/scorer_params.h declares each such E with its choice list, and the registry
  /// declares the parameter with that list, so the two cannot disagree).
  template <typename E>
  E Enum(const std::string& name) const {
    return static_cast<E>(Choice(name));
  }
  /// True when the parameter is declared.
  bool Has(const std::string& name) const { return values_.count(name) != 0; }

 private:
  std::map<std::string, ParamValue> values_;
};

}  // namespace kvtrim
