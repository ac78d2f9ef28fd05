// BearerTokens: the token file's format and limits (errors name the flag and the line and
// never quote a token), token lookup, and the tenant-scoped lease keys.
#include "service/bearer_tokens.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/region_registry.h"
#include "tests/testing/test_dir.h"

namespace kvtrim::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "alpha-token-0123456789abcdef";

TEST(BearerTokensTest, ParsesPairsSkippingCommentsAndBlankLines) {
  auto tokens = BearerTokens::Parse(
      std::string("# token tenant\n\n  ") + kToken + "  alpha \r\nbeta-token-0123456789abcd beta\n"
      "gamma-token-0123456789abc alpha",
      "tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)->size(), 3u);
  EXPECT_EQ((*tokens)->tenants(), 2u);
  EXPECT_EQ(*(*tokens)->TenantOfToken(kToken), "alpha");
  EXPECT_EQ(*(*tokens)->TenantOfToken("gamma-token-0123456789abc"), "alpha");
  const auto unknown = (*tokens)->TenantOfToken("delta-token-0123456789abc");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("authorization: unknown token"));
  EXPECT_THAT(std::string(unknown.status().message()), Not(HasSubstr("delta-token")));
}

TEST(BearerTokensTest, BadLinesNameTheLineNeverTheToken) {
  struct Case {
    std::string text;
    std::string fragment;
  };
  const std::string secret = "s3cret";
  for (const Case& c : {
           Case{std::string(kToken) + "\n", "line 1: expected `<token> <tenant>`, got 1 words"},
           Case{"\n" + secret + " alpha\n", "line 2: the token (6 characters) must have 16..512"},
           Case{std::string(kToken) + "x! alpha\n", "line 1: the token (30 characters)"},
           Case{std::string(kToken) + " al/pha\n", "line 1: the tenant (6 characters)"},
           Case{std::string(kToken) + " " + std::string(65, 't') + "\n",
                "the tenant (65 characters) must have 1..64"},
           Case{std::string(kToken) + " a\n" + kToken + " b\n", "line 2: this token is already"},
           Case{"# nothing\n", "lists no token"},
       }) {
    auto tokens = BearerTokens::Parse(c.text, "tokens");
    ASSERT_FALSE(tokens.ok()) << c.text;
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(tokens.status().message());
    EXPECT_THAT(message, HasSubstr("--auth_tokens_file: "));
    EXPECT_THAT(message, HasSubstr(c.fragment)) << c.text;
    EXPECT_THAT(message, Not(HasSubstr(kToken)));
    EXPECT_THAT(message, Not(HasSubstr(secret)));
  }
}

TEST(BearerTokensTest, FilesAreRegularBoundedAndReadWithoutBlocking) {
  const std::string dir = kvtrim::testing::MakeTestSubdir("bearer_tokens");
  const std::string good = dir + "/tokens";
  std::ofstream(good) << kToken << " alpha\n";
  EXPECT_TRUE(BearerTokens::Load(good).ok());
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto from_fifo = BearerTokens::Load(fifo);  // would block forever if read blindly
  EXPECT_EQ(from_fifo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(from_fifo.status().message()), HasSubstr("is not a regular file"));
  const std::string big = dir + "/big";
  std::ofstream(big) << std::string(BearerTokens::kMaxFileBytes + 1, '#');
  const auto oversize = BearerTokens::Load(big);
  EXPECT_EQ(oversize.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(oversize.status().message()), HasSubstr("at most 1048576"));
  const auto missing = BearerTokens::Load(dir + "/missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("--auth_tokens_file: cannot read"));
}

TEST(BearerTokensTest, LeasesOfOneTenantAreOutOfReachOfAnother) {
  EXPECT_EQ(TenantScopedId("", "abc"), "abc");
  EXPECT_EQ(TenantScopedId("alpha", ""), "");
  EXPECT_EQ(TenantScopedId("alpha", "abc"), "alpha/abc");
  RegionOptions options;
  options.allow_client_shm = true;
  RegionRegistry registry(options, nullptr);
  const std::string id = registry.OpenClient("alpha");
  // The lease exists for alpha only: beta's key of the same id holds nothing of it.
  EXPECT_EQ(registry.clients(), 1);
  registry.CloseClient(TenantScopedId("beta", id));
  EXPECT_EQ(registry.clients(), 1);
  registry.CloseClient(TenantScopedId("alpha", id));
  EXPECT_EQ(registry.clients(), 0);
}

}  // namespace
}  // namespace kvtrim::service
