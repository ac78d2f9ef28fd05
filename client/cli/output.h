// Where and how the CLI's commands print: human-readable text, or with --json one JSON
// object per command on stdout (and errors as one JSON object on stderr), for scripts.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace kvtrim::cli {

/// The CLI's two streams and its output format. Commands print their answer to out() (text)
/// or through Json() (--json), and report failures through RpcError / UsageError /
/// InputError, which print in the same format and return the command's exit code.
class Output {
 public:
  Output(std::ostream& out, std::ostream& err, bool json) : out_(out), err_(err), json_(json) {}

  /// True with --json.
  bool json() const { return json_; }
  /// The answer's stream (text mode).
  std::ostream& out() { return out_; }

  /// Prints `answer` as one line of JSON on stdout.
  void Json(const nlohmann::json& answer);

  /// A failed RPC: text "error: <rpc>: <CODE>: <message>", or JSON {"error": {"kind": "rpc",
  /// "rpc", "code", "message"}}. Returns kExitRpcError.
  int RpcError(const std::string& rpc, const absl::Status& status);
  /// Bad flags or arguments: "usage error: <message>" or {"error": {"kind": "usage",
  /// "message"}}. Returns kExitUsage.
  int UsageError(const std::string& message);
  /// An unreadable or malformed input file: "input error: <message>" or {"error": {"kind":
  /// "input", "message"}}. Returns kExitUsage.
  int InputError(const std::string& message);

 private:
  /// Prints one error in the output's format; `kind` is "rpc", "usage" or "input".
  void Error(const char* kind, const std::string& text_prefix, nlohmann::json error);

  std::ostream& out_;
  std::ostream& err_;
  const bool json_;
};

/// `message` as JSON with the .proto field names, every field printed (zeros and empty lists
/// too, so that scripts find each key), enums by name.
nlohmann::json ProtoJson(const google::protobuf::Message& message);

}  // namespace kvtrim::cli
