#include "client/cli/param_parse.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtrim::cli {

absl::StatusOr<std::map<std::string, v1::ParamValue>> ParseParams(absl::string_view text) {
  std::map<std::string, v1::ParamValue> params;
  if (text.empty()) return params;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--param: \"", item, "\" is not name=value"));
    }
    v1::ParamValue value;
    double number = 0;
    if (kv[1] == "true" || kv[1] == "false") {
      value.set_flag(kv[1] == "true");
    } else if (absl::SimpleAtod(kv[1], &number)) {
      value.set_number(number);
    } else {
      value.set_text(std::string(kv[1]));
    }
    if (!params.emplace(std::string(kv[0]), value).second) {
      return absl::InvalidArgumentError(absl::StrCat("--param: \"", kv[0], "\" given twice"));
    }
  }
  return params;
}

absl::StatusOr<v1::OutputShape> ParseOutputShape(absl::string_view text) {
  if (text == "per_head") return v1::PER_HEAD;
  if (text == "shared") return v1::SHARED;
  return absl::InvalidArgumentError(
      absl::StrCat("--output_shape: \"", text, "\" is not per_head or shared"));
}

}  // namespace kvtrim::cli
