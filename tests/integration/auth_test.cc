// Bearer tokens and tenants end to end: kvtrimd --auth_tokens_file on a unix socket of
// --unix_socket_mode, driven through kvtrim::Client with and without tokens; one tenant's
// lease and regions are out of reach of another tenant's calls; bad token files are
// start-up errors naming the flag and the line, never quoting a token.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvtrim_client.h"
#include "client/regions.h"
#include "client/shm_segment.h"
#include "tests/integration/kvtrimd_process.h"
#include "tests/testing/test_dir.h"

namespace kvtrim {
namespace {

using testing::KvtrimdProcess;

constexpr char kAlphaToken[] = "alpha-token-0123456789abcdef";
constexpr char kBetaToken[] = "beta-token-0123456789abcdef0";
constexpr int kHeads = 2, kTokens = 32, kDim = 8;

/// Writes `text` to a fresh file of the test's directory; returns its path.
std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testing::TestDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

/// An f32 [kHeads, kTokens, kDim] tensor's bytes: distinct values per token.
std::string KeyBytes() {
  std::vector<float> values(kHeads * kTokens * kDim);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 37) % 101) / 50;
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

/// A knorm request keeping 8 of 32 tokens; keys inline, or a host_shm slice of `region`.
v1::CompressRequest KnormRequest(const std::string& region = "") {
  v1::CompressRequest request;
  request.mutable_settings()->mutable_policy()->set_name("knorm");
  request.mutable_settings()->mutable_budget()->set_keep_tokens(8);
  v1::Tensor* keys = request.add_layers()->mutable_keys();
  keys->set_dtype(v1::DTYPE_F32);
  for (int extent : {kHeads, kTokens, kDim}) keys->add_shape(extent);
  if (region.empty()) {
    keys->set_inline_data(KeyBytes());
  } else {
    keys->mutable_host_shm()->set_region_id(region);
  }
  return request;
}

/// A client of `target` sending `token` ("" = none).
std::unique_ptr<Client> Connect(const std::string& target, const std::string& token) {
  ClientOptions options;
  options.auth_token = token;
  options.default_deadline = absl::Seconds(20);
  auto client = Client::Connect(target, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(AuthEndToEndTest, TokensAuthenticateAndTenantsScopeLeases) {
  const std::string tokens = WriteFile(
      "tokens", absl::StrCat("# token tenant\n\n", kAlphaToken, " alpha\n", kBetaToken,
                             "\tbeta\r\n"));
  const std::string socket = testing::TestDir() + "/kvtrimd.sock";
  auto process = KvtrimdProcess::Start(
      KVTRIMD_PATH, {"--backend=cpu", "--workers=1", "--listen=unix:" + socket,
                     "--unix_socket_mode=0600", "--metrics_listen=", "--allow_client_shm",
                     "--auth_tokens_file=" + tokens});
  ASSERT_TRUE(process.ok()) << process.status();
  auto addresses = process->WaitUntilServing(absl::Seconds(60));
  ASSERT_TRUE(addresses.ok()) << addresses.status();
  EXPECT_NE(process->Log().find("auth tokens (2 tenants)"), std::string::npos) << process->Log();
  struct stat st {};
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // No token, a wrong one: UNAUTHENTICATED, the token never echoed; health stays open.
  auto anonymous = Connect(addresses->grpc, "");
  auto health = anonymous->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthState::kServing);
  auto refused = anonymous->ListPolicies();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(refused.status().message().find("authorization: missing"), std::string::npos);
  const std::string wrong_token = "wrong-token-0123456789abcdef";
  auto wrong = Connect(addresses->grpc, wrong_token)->Compress(KnormRequest());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(wrong.status().message().find("unknown token"), std::string::npos);
  EXPECT_EQ(wrong.status().message().find(wrong_token), std::string::npos);

  // Tenant alpha: served; its lease's region is readable with its own client id.
  auto alpha = Connect(addresses->grpc, kAlphaToken);
  ASSERT_TRUE(alpha->ListPolicies().ok());
  auto inline_answer = alpha->Compress(KnormRequest());
  ASSERT_TRUE(inline_answer.ok()) << inline_answer.status();
  auto lease = alpha->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::string bytes = KeyBytes();
  auto segment = SharedMemorySegment::Create(
      absl::StrCat("/kvtrim-auth-test-", getpid()), bytes.size());
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::memcpy((*segment)->data(), bytes.data(), bytes.size());
  auto region = (*lease)->RegisterHostShm((*segment)->name(), bytes.size());
  ASSERT_TRUE(region.ok()) << region.status();
  alpha->SetClientId((*lease)->client_id());
  auto from_region = alpha->Compress(KnormRequest(*region));
  ASSERT_TRUE(from_region.ok()) << from_region.status();
  EXPECT_EQ(from_region->layers(0).indices_size(), inline_answer->layers(0).indices_size());

  // Tenant beta with alpha's client id and region id: refused, alpha's lease untouched.
  auto beta = Connect(addresses->grpc, kBetaToken);
  beta->SetClientId((*lease)->client_id());
  auto stolen = beta->Compress(KnormRequest(*region));
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  EXPECT_NE(stolen.status().message().find("layers[0].keys.host_shm.region_id"),
            std::string::npos);
  EXPECT_TRUE(alpha->Compress(KnormRequest(*region)).ok());
  // ListRegions lists alpha's region to alpha, and to beta the lease does not exist.
  auto listed = alpha->ListRegions();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->regions_size(), 1);
  EXPECT_EQ(listed->regions(0).region_id(), *region);
  auto hidden = beta->ListRegions();
  EXPECT_EQ(hidden.status().code(), absl::StatusCode::kNotFound) << hidden.status();
  EXPECT_TRUE((*lease)->Close().ok());

  auto stopped = process->StopWith(SIGTERM, absl::Seconds(30));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_TRUE(WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0) << process->Log();
}

TEST(AuthEndToEndTest, BadTokenFilesAreStartUpErrorsNamingTheLine) {
  const std::string secret = "short-secret";
  const std::string file =
      WriteFile("bad_tokens", absl::StrCat(kAlphaToken, " alpha\n", secret, " beta\n"));
  for (const auto& [path, expected] :
       std::vector<std::pair<std::string, std::string>>{
           {file, "--auth_tokens_file: line 2: the token (12 characters)"},
           {testing::TestDir() + "/missing", "--auth_tokens_file: cannot read"}}) {
    auto process = KvtrimdProcess::Start(
        KVTRIMD_PATH, {"--backend=cpu", "--listen=127.0.0.1:0", "--metrics_listen=",
                       "--auth_tokens_file=" + path});
    ASSERT_TRUE(process.ok()) << process.status();
    auto serving = process->WaitUntilServing(absl::Seconds(60));
    ASSERT_FALSE(serving.ok());
    EXPECT_NE(process->Log().find(expected), std::string::npos) << process->Log();
    EXPECT_EQ(process->Log().find(secret), std::string::npos) << process->Log();
  }
}

}  // namespace
}  // namespace kvtrim
