// Config validation, strict flag parsing and the kvtrimd binary's exit codes and signals.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/flags/reflection.h"
#include "service/config.h"
#include "service/test_util.h"
#include "tests/testing/test_dir.h"

#ifndef KVTRIMD_PATH
#error "KVTRIMD_PATH must name the kvtrimd binary"
#endif

namespace kvtrim::service::testing {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

/// ParseCommandLineStrict over `args` (argv[0] first).
absl::Status Parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseCommandLineStrict(static_cast<int>(argv.size()), argv.data());
}

TEST(ConfigTest, DefaultsAreValid) {
  Config config;
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.ResolvedBackendName(), "cpu");
  EXPECT_EQ(config.data_dir, "");  // models in memory unless --data_dir is set
  EXPECT_EQ(config.max_models, 16);
  EXPECT_EQ(config.max_model_bytes, int64_t{16} << 30);
  EXPECT_EQ(config.numerics, Numerics::kFast);  // fast by default (design.md, "Numerics")
}

TEST(ConfigTest, NumericsFlagIsParsedAndValidatedOnce) {
  absl::FlagSaver saver;
  auto config = ConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->numerics, Numerics::kFast);
  ASSERT_TRUE(Parse({"kvtrimd", "--numerics=exact"}).ok());
  config = ConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->numerics, Numerics::kExact);
  ASSERT_TRUE(Parse({"kvtrimd", "--numerics", "fast"}).ok());
  EXPECT_EQ(ConfigFromFlags()->numerics, Numerics::kFast);
  ASSERT_TRUE(Parse({"kvtrimd", "--numerics=FAST"}).ok());  // a string: checked once, here
  const absl::Status bad = ConfigFromFlags().status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(bad), "--numerics: must be fast or exact, got 'FAST'");
}

TEST(ConfigTest, EveryBadValueNamesItsFlag) {
  struct Case {
    void (*mutate)(Config&);
    const char* flag;
  };
  const Case cases[] = {
      {[](Config& c) { c.listen = "nohost"; }, "--listen"},
      {[](Config& c) { c.listen = "127.0.0.1:70000"; }, "--listen"},
      {[](Config& c) { c.listen = ":50051"; }, "--listen"},
      {[](Config& c) { c.listen = "unix:"; }, "--listen"},
      {[](Config& c) { c.listen = "::1:50051"; }, "--listen"},
      {[](Config& c) { c.metrics_listen = "unix:/run/kvtrim/metrics.sock"; }, "--metrics_listen"},
      {[](Config& c) { c.metrics_listen = "localhost:abc"; }, "--metrics_listen"},
      {[](Config& c) { c.max_message_bytes = 10; }, "--max_message_bytes"},
      {[](Config& c) { c.max_message_bytes = int64_t{1} << 40; }, "--max_message_bytes"},
      {[](Config& c) { c.workers = 0; }, "--workers"},
      {[](Config& c) { c.max_leases = 0; }, "--max_leases"},
      {[](Config& c) { c.http2_window_bytes = -1; }, "--http2_window_bytes"},
      {[](Config& c) { c.max_inflight = 0; }, "--max_inflight"},
      {[](Config& c) { c.admission_wait_ms = -1; }, "--admission_wait_ms"},
      {[](Config& c) { c.host_buffer_idle_s = -1; }, "--host_buffer_idle_s"},
      {[](Config& c) { c.admission_wait_ms = 60001; }, "--admission_wait_ms"},
      {[](Config& c) { c.drain_timeout_s = -1; }, "--drain_timeout_s"},
      {[](Config& c) { c.max_connection_age_s = -1; }, "--max_connection_age_s"},
      {[](Config& c) { c.max_connection_age_s = 7 * 86400 + 1; }, "--max_connection_age_s"},
      {[](Config& c) { c.max_connection_age_grace_s = -1; }, "--max_connection_age_grace_s"},
      {[](Config& c) { c.gpu_launch_graphs = -1; }, "--gpu_launch_graphs"},
      {[](Config& c) { c.max_models = 0; }, "--max_models"},
      {[](Config& c) { c.max_models = 5000; }, "--max_models"},
      {[](Config& c) { c.max_model_bytes = 10; }, "--max_model_bytes"},
      {[](Config& c) { c.data_dir = "/srv/kvtrim/a\nb"; }, "--data_dir"},
      {[](Config& c) { c.port_file = "/run/kvtrim/\tports"; }, "--port_file"},
      {[](Config& c) { c.port_file = "/run/kvtrim/"; }, "--port_file"},
  };
  for (const auto& c : cases) {
    Config config;
    c.mutate(config);
    const absl::Status s = config.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_THAT(Message(s), HasSubstr(c.flag));
  }
}

TEST(ConfigTest, GoodAddresses) {
  for (const char* a : {"127.0.0.1:0", "0.0.0.0:50051", "[::1]:9464", "localhost:1",
                        "unix:/run/kvtrim/kvtrim.sock"}) {
    EXPECT_TRUE(ValidateListenAddress(a, "--listen", true).ok()) << a;
  }
}

TEST(ConfigTest, DevicesAreParsed) {
  EXPECT_TRUE(ParseDevices("all")->empty());
  EXPECT_TRUE(ParseDevices("")->empty());
  EXPECT_EQ(*ParseDevices("0"), std::vector<int>({0}));
  EXPECT_EQ(*ParseDevices(" 2, 0 ,5"), std::vector<int>({2, 0, 5}));
  for (const char* bad : {"-1", "0,0", "x", "1,", "1024", "0;1"}) {
    const auto parsed = ParseDevices(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), ::testing::HasSubstr("--devices")) << bad;
  }
  EXPECT_THAT(std::string(ParseDevices("3,3").status().message()),
              ::testing::HasSubstr("names device 3 twice"));
}

TEST(ConfigTest, GpuWithoutCudaBuild) {
  if (BuiltWithCuda()) GTEST_SKIP() << "CUDA build";
  Config config;
  config.backend = BackendKind::kGpu;
  const absl::Status s = config.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("--backend=gpu"));
}

TEST(ConfigTest, StrictParserNamesTheFlag) {
  absl::FlagSaver saver;
  EXPECT_THAT(Message(Parse({"kvtrimd", "--workers=abc"})), HasSubstr("--workers"));
  EXPECT_THAT(Message(Parse({"kvtrimd", "--bogus=1"})), HasSubstr("--bogus: unknown flag"));
  EXPECT_THAT(Message(Parse({"kvtrimd", "--max_inflight"})), HasSubstr("--max_inflight: missing"));
  EXPECT_THAT(Message(Parse({"kvtrimd", "stray"})), HasSubstr("unexpected argument 'stray'"));
  EXPECT_TRUE(Parse({"kvtrimd", "--workers", "3", "--backend=cpu", "--metrics_listen=",
                     "--data_dir=/var/lib/kvtrim", "--max_models=4",
                     "--max_model_bytes=1048576"}).ok());
  auto config = ConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->data_dir, "/var/lib/kvtrim");
  EXPECT_EQ(config->max_models, 4);
  EXPECT_EQ(config->max_model_bytes, 1048576);
  EXPECT_EQ(config->workers, 3);
  EXPECT_EQ(config->backend, BackendKind::kCpu);
  EXPECT_EQ(config->metrics_listen, "");
  EXPECT_TRUE(Parse({"kvtrimd", "--backend=tpu"}).ok());  // a string: checked by ConfigFromFlags
  EXPECT_THAT(Message(ConfigFromFlags().status()), HasSubstr("--backend"));
}

/// Runs kvtrimd with `args`; returns its exit status and captures stdout + stderr.
/// The whole content of the file at `path` ("" when it cannot be read).
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int RunKvtrimd(const std::string& args, std::string* output) {
  const std::string command = std::string(KVTRIMD_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(KvtrimdBinaryTest, HelpDocumentsEveryFlag) {
  std::string out;
  EXPECT_EQ(RunKvtrimd("--help", &out), 0);
  for (const char* flag : {"--listen", "--metrics_listen", "--max_message_bytes", "--workers",
                           "--max_inflight", "--backend", "--drain_timeout_s", "--data_dir",
                           "--max_models", "--max_model_bytes", "--numerics", "--port_file"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
}

TEST(KvtrimdBinaryTest, BadFlagsExitTwoNamingTheFlag) {
  const std::pair<const char*, const char*> cases[] = {
      {"--workers=abc", "--workers"},
      {"--workers=0", "--workers"},
      {"--max_inflight=-1", "--max_inflight"},
      {"--admission_wait_ms=1.5", "--admission_wait_ms"},
      {"--max_message_bytes=12", "--max_message_bytes"},
      {"--listen=nowhere", "--listen"},
      {"--metrics_listen=x:y", "--metrics_listen"},
      {"--backend=tpu", "--backend"},
      {"--backend=gpu", "--backend"},
      {"--numerics=approximate", "--numerics"},
      {"--drain_timeout_s=-5", "--drain_timeout_s"},
      {"--max_models=0", "--max_models"},
      {"--max_model_bytes=abc", "--max_model_bytes"},
      {"--no_such_flag", "--no_such_flag"},
  };
  for (const auto& [args, flag] : cases) {
    if (std::string(args) == "--backend=gpu" && BuiltWithCuda()) continue;
    std::string out;
    EXPECT_EQ(RunKvtrimd(args, &out), 2) << args << ": " << out;
    EXPECT_THAT(out, HasSubstr(flag)) << args;
  }
}

TEST(KvtrimdBinaryTest, UnusableDataDirExitsOne) {
  std::string out;
  EXPECT_EQ(RunKvtrimd("--listen=127.0.0.1:0 --metrics_listen= --backend=cpu --workers=1 "
                       "--data_dir=/dev/null/models",
                       &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("cannot start: --data_dir: cannot create '/dev/null/models'"));
}

TEST(KvtrimdBinaryTest, UnwritablePortFileExitsOne) {
  std::string out;
  EXPECT_EQ(RunKvtrimd("--listen=127.0.0.1:0 --metrics_listen= --backend=cpu --workers=1 "
                       "--port_file=/dev/null/ports",
                       &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("cannot start: --port_file: cannot create '/dev/null/ports.tmp."));
}

TEST(KvtrimdBinaryTest, ServesThenDrainsOnSigterm) {
  const std::string port_file = kvtrim::testing::TestPath("kvtrimd.ports");
  const std::string port_file_flag = "--port_file=" + port_file;
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    close(out_pipe[0]);
    execl(KVTRIMD_PATH, "kvtrimd", "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
          "--workers=1", "--drain_timeout_s=5", "--backend=cpu", port_file_flag.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  // Read the start-up line.
  std::string line;
  char c;
  while (read(out_pipe[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out_pipe[0]);
  EXPECT_THAT(line, HasSubstr("serving on 127.0.0.1:"));
  EXPECT_THAT(line, HasSubstr("backend cpu"));
  EXPECT_THAT(line, HasSubstr("numerics fast"));
  EXPECT_THAT(line, HasSubstr("workers 1"));
  // Health over gRPC on the announced port.
  const auto start = line.find("serving on ") + 11;
  const std::string address = line.substr(start, line.find(' ', start) - start);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(HealthCheck(channel, "kvtrim.v1.Kvtrim"), 1);
  // The port file, written before the start-up line, names the same addresses.
  const std::string metrics = line.substr(line.find("http://") + 7);
  EXPECT_EQ(ReadFile(port_file), "grpc=" + address + "\nmetrics=" +
                                     metrics.substr(0, metrics.find("/metrics")) + "\n");
  const auto stop_start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  // Nothing in flight: the drain does not wait for the open client connection.
  EXPECT_LT(std::chrono::steady_clock::now() - stop_start, std::chrono::seconds(4));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // Removed once kvtrimd stopped serving: nobody waiting for it finds a stopped server.
  EXPECT_NE(access(port_file.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace kvtrim::service::testing
