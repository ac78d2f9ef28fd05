// libFuzzer's initialisation hook for the targets over protobuf messages (a source of each,
// never of a library: the hook is looked up as a weak symbol). It silences libprotobuf's
// log lines (e.g. "String field ... contains invalid UTF-8 data"), which undecodable inputs
// trigger on every run; the parse result is what the targets check.
#include "google/protobuf/stubs/logging.h"

/// Called once by libFuzzer before the first input.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
