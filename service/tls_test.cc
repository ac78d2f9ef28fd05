// kvtrimd over TLS and mutual TLS, end to end: a CA, a server and a client certificate made
// with the openssl tool for the test (tests/testing/make_test_certs.sh); clients with the
// right credentials are served, others are refused at the handshake; wrong files are
// start-up errors naming the flag.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "service/test_util.h"
#include "service/tls_credentials.h"
#include "tests/testing/test_dir.h"

namespace kvtrim::service::testing {
namespace {

namespace fs = std::filesystem;

/// The contents of `path`.
std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(kvtrim::testing::MakeTestSubdir("tls"));
    const std::string command = std::string("bash '") + KVTRIM_MAKE_TEST_CERTS + "' '" +
                                *dir_ + "' >'" + *dir_ + "/openssl.log' 2>&1";
    made_ = std::system(command.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    if (!made_) GTEST_FAIL() << "openssl could not make the test certificates (" << *dir_ << ")";
  }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  /// TestConfig serving TLS (and mutual TLS with `client_ca`).
  static Config TlsConfig(bool client_ca) {
    Config config = TestConfig();
    config.tls_cert = File("server.pem");
    config.tls_key = File("server.key");
    if (client_ca) config.tls_client_ca = File("ca.pem");
    return config;
  }

  /// The status of a ListPolicies call to `server` through `credentials`.
  static grpc::Status Probe(const Server& server,
                            const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    auto channel = grpc::CreateChannel(server.address(), credentials);
    auto stub = v1::Kvtrim::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListPoliciesResponse response;
    return stub->ListPolicies(&context, v1::ListPoliciesRequest(), &response);
  }
  static std::shared_ptr<grpc::ChannelCredentials> Ssl(const std::string& ca,
                                                       const std::string& who = "") {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = Slurp(File(ca));
    if (!who.empty()) {
      options.pem_cert_chain = Slurp(File(who + ".pem"));
      options.pem_private_key = Slurp(File(who + ".key"));
    }
    return grpc::SslCredentials(options);
  }

  static inline std::string* dir_ = nullptr;
  static inline bool made_ = false;
};

TEST_F(TlsTest, ServesTlsClientsOnly) {
  auto server = StartServer(TlsConfig(false));
  ASSERT_NE(server, nullptr);
  EXPECT_STREQ(TransportSecurityName(server->config()), "tls");
  EXPECT_TRUE(Probe(*server, Ssl("ca.pem")).ok());
  EXPECT_EQ(Probe(*server, grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA refuses the server.
  EXPECT_EQ(Probe(*server, Ssl("other.pem")).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateOfTheCa) {
  auto server = StartServer(TlsConfig(true));
  ASSERT_NE(server, nullptr);
  EXPECT_STREQ(TransportSecurityName(server->config()), "mtls");
  EXPECT_TRUE(Probe(*server, Ssl("ca.pem", "client")).ok());
  EXPECT_EQ(Probe(*server, Ssl("ca.pem")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Probe(*server, grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, WrongFilesAreStartUpErrorsNamingTheFlag) {
  const auto start_error = [](const Config& config) {
    auto server = Server::Start(config, std::clog);
    return server.ok() ? absl::OkStatus() : server.status();
  };
  Config missing = TlsConfig(false);
  missing.tls_cert = File("nope.pem");
  EXPECT_EQ(start_error(missing).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(start_error(missing).message()),
              ::testing::HasSubstr("--tls_cert: cannot read '" + File("nope.pem") + "'"));
  Config mismatched = TlsConfig(false);
  mismatched.tls_key = File("client.key");
  EXPECT_THAT(std::string(start_error(mismatched).message()),
              ::testing::HasSubstr("--tls_key: the private key does not match the certificate"));
  Config not_pem = TlsConfig(true);
  not_pem.tls_client_ca = File("san.ext");
  EXPECT_THAT(std::string(start_error(not_pem).message()),
              ::testing::HasSubstr("--tls_client_ca: '" + File("san.ext") +
                                   "' holds no PEM certificate"));
  Config half = TestConfig();
  half.tls_cert = File("server.pem");
  EXPECT_THAT(std::string(half.Validate().message()),
              ::testing::HasSubstr("--tls_cert / --tls_key: give both"));
}

}  // namespace
}  // namespace kvtrim::service::testing
