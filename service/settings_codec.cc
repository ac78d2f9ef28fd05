#include "service/settings_codec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "kernels/engine.h"

namespace kvtrim::service {

namespace {

absl::Status DecodeBudget(const v1::Budget& budget, const std::string& field, Budget* out) {
  switch (budget.value_case()) {
    case v1::Budget::kKeepFraction: {
      const double f = budget.keep_fraction();
      if (std::isnan(f) || f <= 0 || f > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".keep_fraction: must be in (0, 1], got ", ExactNumber(f)));
      }
      out->by_fraction = true;
      out->keep_fraction = f;
      return absl::OkStatus();
    }
    case v1::Budget::kKeepTokens: {
      const int64_t k = budget.keep_tokens();
      if (k < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".keep_tokens: must be >= 1, got ", k));
      }
      out->by_fraction = false;
      out->keep_tokens = k;
      return absl::OkStatus();
    }
    case v1::Budget::kMaxPerturbation: {
      const double epsilon = budget.max_perturbation().epsilon();
      if (!std::isfinite(epsilon) || epsilon < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".max_perturbation.epsilon: must be finite and >= 0, got ",
            ExactNumber(epsilon)));
      }
      // 0 (unset) = 1: no cap below every token.
      const double cap = budget.max_perturbation().max_keep_fraction();
      if (std::isnan(cap) || cap < 0 || cap > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".max_perturbation.max_keep_fraction: must be in (0, 1] (0 = 1), got ",
            ExactNumber(cap)));
      }
      out->by_fraction = true;
      out->keep_fraction = cap == 0 ? 1.0 : cap;
      out->by_perturbation = true;
      out->epsilon = epsilon;
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": required; set keep_fraction in (0, 1], keep_tokens >= 1 or "
                 "max_perturbation"));
  }
}

absl::StatusOr<OutputShape> DecodeOutputShape(v1::OutputShape shape, const std::string& field) {
  switch (shape) {
    case v1::OUTPUT_SHAPE_UNSPECIFIED:
    case v1::PER_HEAD:
      return OutputShape::kPerHead;
    case v1::SHARED:
      return OutputShape::kShared;
    case v1::BLOCK_ALIGNED:
      return OutputShape::kBlockAligned;
    case v1::EQUAL_COUNT:
      return OutputShape::kEqualCount;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown output shape ", static_cast<int>(shape)));
  }
}

absl::StatusOr<Numerics> DecodeNumerics(v1::Numerics numerics, Numerics default_numerics,
                                        const std::string& field) {
  switch (numerics) {
    case v1::NUMERICS_UNSPECIFIED:
      return default_numerics;
    case v1::NUMERICS_FAST:
      return Numerics::kFast;
    case v1::NUMERICS_EXACT:
      return Numerics::kExact;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown numerics mode ", static_cast<int>(numerics),
          "; use NUMERICS_FAST, NUMERICS_EXACT or leave it unspecified (the server default)"));
  }
}

}  // namespace

absl::StatusOr<CompressionSettings> DecodeSettings(const v1::CompressionSettings& settings,
                                                   const std::string& field,
                                                   Numerics default_numerics) {
  CompressionSettings out;
  out.policy = settings.policy().name();
  for (const auto& [name, value] : settings.policy().params()) {
    switch (value.value_case()) {
      case v1::ParamValue::kNumber:
        out.params[name] = ParamValue::Number(value.number());
        break;
      case v1::ParamValue::kText:
        out.params[name] = ParamValue::Text(value.text());
        break;
      case v1::ParamValue::kFlag:
        out.params[name] = ParamValue::Flag(value.flag());
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".policy.params.", ClientTextInField(name),
            ": no value; set number, text or flag"));
    }
  }
  if (!settings.has_budget()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".budget: required; set keep_fraction in (0, 1], keep_tokens >= 1 or "
               "max_perturbation"));
  }
  KVTRIM_RETURN_IF_ERROR(DecodeBudget(settings.budget(), field + ".budget", &out.budget));
  if (settings.has_sink_tokens()) {
    if (settings.sink_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".sink_tokens: must be >= 0, got ", settings.sink_tokens()));
    }
    out.sink_tokens = settings.sink_tokens();
  }
  if (settings.has_recent_tokens()) {
    if (settings.recent_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".recent_tokens: must be >= 0, got ", settings.recent_tokens()));
    }
    out.recent_tokens = settings.recent_tokens();
  }
  auto shape = DecodeOutputShape(settings.output_shape(), field + ".output_shape");
  if (!shape.ok()) return shape.status();
  out.output_shape = *shape;
  if (settings.num_layers() < 0 || settings.num_layers() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".num_layers: must be in [0, ", kMaxLayers, "] (0 = unknown), got ",
                     settings.num_layers()));
  }
  out.num_layers = settings.num_layers();
  out.seed = settings.seed();
  if (settings.block_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".block_size: must be >= 0, got ", settings.block_size()));
  }
  out.block_size = settings.block_size();
  out.model_digest = settings.model_digest();
  auto numerics = DecodeNumerics(settings.numerics(), default_numerics, field + ".numerics");
  if (!numerics.ok()) return numerics.status();
  out.numerics = *numerics;
  switch (settings.perturbation()) {
    case v1::PERTURBATION_UNSPECIFIED:
    case v1::PERTURBATION_FULL:
      out.perturbation = true;
      break;
    case v1::PERTURBATION_OFF:
      out.perturbation = false;
      break;
    case v1::PERTURBATION_SAMPLED:
      out.perturbation = true;
      out.perturbation_sampled = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".perturbation: unknown perturbation mode ",
          static_cast<int>(settings.perturbation()), " (FULL, SAMPLED or OFF)"));
  }
  switch (settings.answer_encoding()) {
    case v1::ANSWER_ENCODING_UNSPECIFIED:
    case v1::ANSWER_ENCODING_REPEATED:
      out.packed_answer = false;
      break;
    case v1::ANSWER_ENCODING_PACKED:
      out.packed_answer = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".answer_encoding: unknown answer encoding ",
          static_cast<int>(settings.answer_encoding()), " (REPEATED or PACKED)"));
  }
  out.profile = settings.profile();
  return out;
}

}  // namespace kvtrim::service
