// The CLI's commands as data: name, synopsis, what each does and which flags it reads, for
// `kvtrim help`, `kvtrim help CMD` and `kvtrim CMD --help`.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvtrim::cli {

/// One command of the CLI.
struct CommandInfo {
  std::string name;                 // e.g. "compress"
  std::string summary;              // one line for `kvtrim help`'s list
  std::string synopsis;             // e.g. "kvtrim --target=ADDR compress --policy=..."
  std::string description;          // what it does and prints, a few lines
  std::vector<std::string> flags;   // the flags it reads besides the connection flags
  bool needs_target = true;         // false: runs locally (profile)
  int arguments = 0;                // positional arguments after the command's name
};

/// Every command, in the order `kvtrim help` lists them.
const std::vector<CommandInfo>& Commands();

/// The command named `name`, or nullptr.
const CommandInfo* FindCommand(absl::string_view name);

/// The flags every command that talks to kvtrimd reads (--target, deadlines, TLS, token),
/// plus --json.
const std::vector<std::string>& ConnectionFlags();

/// `kvtrim help`: usage, the commands with their one-line summaries, exit codes and the
/// connection flags.
std::string GeneralHelp();

/// `kvtrim help CMD` / `kvtrim CMD --help`: the command's synopsis, description and its
/// flags (then the connection flags when it talks to kvtrimd), each with default and help.
std::string CommandHelp(const CommandInfo& command);

}  // namespace kvtrim::cli
