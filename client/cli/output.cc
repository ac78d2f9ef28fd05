#include "client/cli/output.h"

#include <utility>

#include "client/cli/commands.h"
#include "google/protobuf/util/json_util.h"

namespace kvtrim::cli {

void Output::Json(const nlohmann::json& answer) { out_ << answer.dump() << "\n"; }

void Output::Error(const char* kind, const std::string& text_prefix, nlohmann::json error) {
  if (!json_) {
    err_ << text_prefix << error.at("message").get<std::string>() << "\n";
    return;
  }
  error["kind"] = kind;
  // Replace, not throw, on bytes that are not UTF-8 (a server message quoting client text).
  err_ << nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false,
                                                           nlohmann::json::error_handler_t::replace)
       << "\n";
}

int Output::RpcError(const std::string& rpc, const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  Error("rpc", "error: " + rpc + ": " + code + ": ",
        {{"rpc", rpc}, {"code", code}, {"message", std::string(status.message())}});
  return kExitRpcError;
}

int Output::UsageError(const std::string& message) {
  Error("usage", "usage error: ", {{"message", message}});
  return kExitUsage;
}

int Output::InputError(const std::string& message) {
  Error("input", "input error: ", {{"message", message}});
  return kExitUsage;
}

nlohmann::json ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  const auto status = google::protobuf::util::MessageToJsonString(message, &text, options);
  if (!status.ok()) return nlohmann::json{{"unprintable", std::string(status.message())}};
  return nlohmann::json::parse(text);
}

}  // namespace kvtrim::cli
