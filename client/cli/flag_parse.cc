#include "client/cli/flag_parse.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvtrim::cli {

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      parsed.positional.insert(parsed.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      parsed.positional.emplace_back(arg);
      continue;
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    absl::string_view name = arg.substr(0, eq);
    if (name == "help" || name == "h") {
      parsed.help = true;
      continue;
    }
    if (name == "version") {
      parsed.version = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string value;
    if (flag == nullptr && eq == absl::string_view::npos && absl::StartsWith(name, "no")) {
      // --noname for a boolean flag.
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        value = "false";
      }
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (value.empty()) {
      if (eq != absl::string_view::npos) {
        value = std::string(arg.substr(eq + 1));
      } else if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", flag->Name(), "=", value, ": ", error));
    }
  }
  return parsed;
}

std::string FlagsHelp(absl::string_view file_substring) {
  std::vector<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), file_substring)) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return DescribeFlags(names);
}

std::string DescribeFlags(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    absl::StrAppend(&out, "  --", flag->Name(), " (default: \"", flag->DefaultValue(),
                    "\")\n      ", flag->Help(), "\n");
  }
  return out;
}

}  // namespace kvtrim::cli
