// Command-line parsing for the kvtrim CLI over Abseil's flag registry, with usage errors
// returned as a status (absl::ParseCommandLine would exit(1) on its own; the CLI's usage
// errors exit with 2).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtrim::cli {

/// The result of parsing argv: the positional arguments (argv[0] excluded) and whether
/// --help / -h or --version was given.
struct ParsedArgs {
  std::vector<std::string> positional;
  bool help = false;
  bool version = false;
};

/// Sets every registered Abseil flag named in argv ("--name=value", "--name value",
/// "--bool_flag", "--nobool_flag"; one or two leading dashes; "--" ends the flags).
/// INVALID_ARGUMENT naming the flag for an unknown flag, a missing value or a value that
/// does not parse.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args);

/// DescribeFlags of every flag defined in a file whose path contains `file_substring`,
/// sorted by name.
std::string FlagsHelp(absl::string_view file_substring);

/// "  --name (default: "value")\n      help\n" for each of `names` that is a registered
/// flag, in that order.
std::string DescribeFlags(const std::vector<std::string>& names);

}  // namespace kvtrim::cli
