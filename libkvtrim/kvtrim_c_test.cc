// libkvtrim's C ABI, through the shared library as a caller loads it: answers equal the
// engine's own (PolicyEngine on the CPU backend), and every misuse is a status naming the
// argument or field, never a crash.
#include "libkvtrim/kvtrim_c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/engine.h"
#include "tests/testing/random_layer_test_util.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "tests/integration/kvtrimd_process.h"

namespace kvtrim {
namespace {

constexpr int32_t kInvalidArgument = 3;
constexpr int32_t kFailedPrecondition = 9;

/// A CPU engine from the library, freed at the end of the test.
class KvtrimCTest : public ::testing::Test {
 public:
  /// A kvtrim_tensor over a host float32 [a, b, c] buffer.
  static kvtrim_tensor Host(const float* data, int64_t a, int64_t b, int64_t c) {
    kvtrim_tensor t{};
    t.data = data;
    t.dtype = v1::DTYPE_F32;
    t.device = -1;
    t.shape[0] = a;
    t.shape[1] = b;
    t.shape[2] = c;
    return t;
  }

  /// Settings of `policy` keeping `keep` of the tokens.
  static v1::CompressionSettings Settings(const std::string& policy, double keep) {
    v1::CompressionSettings settings;
    settings.mutable_policy()->set_name(policy);
    settings.mutable_budget()->set_keep_fraction(keep);
    return settings;
  }

 protected:
  void SetUp() override {
    ASSERT_EQ(kvtrim_engine_create("cpu", 0, 2, "fast", &engine_, error_, sizeof(error_)), 0)
        << error_;
  }
  void TearDown() override { kvtrim_engine_free(engine_); }

  /// kvtrim_compress of one layer; on success the parsed answer.
  int32_t Compress(const v1::CompressionSettings& settings, const kvtrim_layer& layer,
                   v1::CompressResponse* response) {
    const std::string bytes = settings.SerializeAsString();
    void* answer = nullptr;
    size_t size = 0;
    const int32_t code = kvtrim_compress(engine_, bytes.data(), bytes.size(), &layer, 1, nullptr,
                                         &answer, &size, error_, sizeof(error_));
    if (code == 0) {
      EXPECT_TRUE(response->ParseFromArray(answer, static_cast<int>(size)));
      kvtrim_buffer_free(answer);
    } else {
      EXPECT_EQ(answer, nullptr);
    }
    return code;
  }

  kvtrim_engine* engine_ = nullptr;
  char error_[512] = {0};
};

TEST_F(KvtrimCTest, AnswersEqualTheEnginesOwn) {
  EXPECT_EQ(kvtrim_abi_version(), KVTRIM_ABI_VERSION);
  EXPECT_STREQ(kvtrim_engine_backend(engine_), "cpu");
  RandomLayer data(4, 300, 64, 8, 32, /*seed=*/11);
  kvtrim_layer layer{};
  layer.layer_id = 3;
  layer.keys = Host(data.k.data(), 4, 300, 64);
  layer.values = Host(data.v.data(), 4, 300, 64);
  layer.queries = Host(data.q.data(), 8, 32, 64);

  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  CpuBackend backend(2);
  PolicyEngine engine(registry, backend);
  for (const std::string policy : {"dropkv", "snapkv+adakv", "tova", "knorm"}) {
    v1::CompressResponse response;
    ASSERT_EQ(Compress(Settings(policy, 0.2), layer, &response), 0) << error_;
    ASSERT_EQ(response.layers_size(), 1);
    const v1::LayerResult& result = response.layers(0);
    EXPECT_EQ(response.backend(), "cpu");
    EXPECT_EQ(result.layer_id(), 3);

    CompressionSettings settings;
    settings.policy = policy;
    settings.budget.keep_fraction = 0.2;
    settings.num_layers = 4;
    auto resolved = engine.Prepare(settings, "settings");
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    data.request.layer_id = 3;
    auto expected = engine.CompressLayer(*resolved, data.request, "layers[0]");
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(std::vector<int64_t>(result.offsets().begin(), result.offsets().end()),
              expected->offsets)
        << policy;
    EXPECT_EQ(std::vector<int32_t>(result.indices().begin(), result.indices().end()),
              expected->indices)
        << policy;
    ASSERT_EQ(result.heads_size(), 4);
    EXPECT_DOUBLE_EQ(result.heads(0).perturbation(), expected->perturbation[0]);
  }
}

TEST_F(KvtrimCTest, MisuseIsAStatusNamingTheArgument) {
  RandomLayer data(2, 40, 8, 4, 4);
  kvtrim_layer layer{};
  layer.keys = Host(data.k.data(), 2, 40, 8);
  v1::CompressResponse response;

  // Settings the service would refuse, refused the same way.
  EXPECT_EQ(Compress(Settings("no_such_policy", 0.2), layer, &response), kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("settings.policy.name:", 0), 0u) << error_;
  EXPECT_EQ(Compress(Settings("dropkv", 1.5), layer, &response), kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("settings.budget.keep_fraction", 0), 0u) << error_;
  EXPECT_EQ(Compress(Settings("dropkv", 0.5), layer, &response), kInvalidArgument);
  EXPECT_NE(std::string(error_).find("layers[0]"), std::string::npos) << error_;  // no queries
  v1::CompressionSettings model = Settings("criticalkv", 0.5);
  model.set_model_digest("sha256:" + std::string(64, '0'));
  EXPECT_EQ(Compress(model, layer, &response), kFailedPrecondition);
  EXPECT_EQ(std::string(error_).rfind("settings.model_digest:", 0), 0u) << error_;

  // Tensors the ABI cannot take.
  kvtrim_layer bad = layer;
  bad.keys.dtype = 7;
  EXPECT_EQ(Compress(Settings("knorm", 0.5), bad, &response), kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("layers[0].keys.dtype:", 0), 0u) << error_;
  bad = layer;
  bad.keys.strides[0] = 8;
  bad.keys.strides[1] = 16;
  bad.keys.strides[2] = 1;
  EXPECT_EQ(Compress(Settings("knorm", 0.5), bad, &response), kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("layers[0].keys.strides:", 0), 0u) << error_;
  bad = layer;
  bad.keys.device = 0;
  EXPECT_EQ(Compress(Settings("knorm", 0.5), bad, &response), kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("layers[0].keys.device:", 0), 0u) << error_;

  // A device output region on the CPU backend: refused naming it.
  bad = layer;
  std::vector<char> output(1 << 16);
  bad.output = output.data();
  bad.output_capacity = output.size();
  EXPECT_EQ(Compress(Settings("knorm", 0.5), bad, &response), kFailedPrecondition);
  EXPECT_EQ(std::string(error_).rfind("layers[0].output:", 0), 0u) << error_;

  // Arguments.
  void* answer = nullptr;
  size_t size = 0;
  const std::string garbage = "\xff\xff\xff";
  EXPECT_EQ(kvtrim_compress(engine_, garbage.data(), garbage.size(), &layer, 1, nullptr, &answer,
                            &size, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("settings:", 0), 0u) << error_;
  const std::string settings = Settings("knorm", 0.5).SerializeAsString();
  EXPECT_EQ(kvtrim_compress(engine_, settings.data(), settings.size(), &layer, 0, nullptr, &answer,
                            &size, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("layers:", 0), 0u) << error_;
  EXPECT_EQ(kvtrim_compress(nullptr, settings.data(), settings.size(), &layer, 1, nullptr, &answer,
                            &size, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(kvtrim_compress(engine_, settings.data(), settings.size(), &layer, 1, nullptr, nullptr,
                            &size, nullptr, 0),
            kInvalidArgument);  // no error buffer: only the code
  kvtrim_layer twice[2] = {layer, layer};
  EXPECT_EQ(kvtrim_compress(engine_, settings.data(), settings.size(), twice, 2, nullptr, &answer,
                            &size, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("layers[1].layer_id:", 0), 0u) << error_;

  // A truncated error buffer still ends in NUL.
  char tiny[8];
  EXPECT_EQ(kvtrim_compress(engine_, garbage.data(), garbage.size(), &layer, 1, nullptr, &answer,
                            &size, tiny, sizeof(tiny)),
            kInvalidArgument);
  EXPECT_EQ(std::strlen(tiny), sizeof(tiny) - 1);
  kvtrim_buffer_free(nullptr);
  kvtrim_engine_free(nullptr);
}

TEST_F(KvtrimCTest, EngineCreationAndModelsRefuseBadArguments) {
  kvtrim_engine* other = nullptr;
  EXPECT_EQ(kvtrim_engine_create("tpu", 0, 1, "fast", &other, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("backend:", 0), 0u) << error_;
  EXPECT_EQ(other, nullptr);
  EXPECT_EQ(kvtrim_engine_create("cpu", 0, 0, "fast", &other, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("workers:", 0), 0u) << error_;
  EXPECT_EQ(kvtrim_engine_create("cpu", 0, 1, "sloppy", &other, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("numerics:", 0), 0u) << error_;

  // A model: header, one W_O per layer; the digest buffer must hold it.
  v1::RegisterModelRequest header;
  v1::ModelHeader* h = header.mutable_header();
  h->set_name("tiny");
  h->set_num_layers(1);
  h->set_num_query_heads(2);
  h->set_num_kv_heads(1);
  h->set_head_dim(4);
  h->set_hidden_size(8);
  h->set_rope_theta(10000);
  v1::RegisterModelRequest weight;
  v1::ModelWeightChunk* w = weight.mutable_weight();
  w->set_name("layers.0.w_o");
  w->set_dtype(v1::DTYPE_F32);
  w->add_shape(8);
  w->add_shape(8);
  w->set_data(std::string(8 * 8 * 4, '\0'));
  const std::string a = header.SerializeAsString(), b = weight.SerializeAsString();
  const void* messages[] = {a.data(), b.data()};
  const size_t sizes[] = {a.size(), b.size()};
  char digest[80];
  ASSERT_EQ(kvtrim_register_model(engine_, messages, sizes, 2, digest, sizeof(digest), error_,
                                  sizeof(error_)),
            0)
      << error_;
  EXPECT_EQ(std::string(digest).rfind("sha256:", 0), 0u);
  EXPECT_EQ(std::strlen(digest), 71u);
  EXPECT_EQ(kvtrim_register_model(engine_, messages, sizes, 2, digest, 16, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("digest:", 0), 0u) << error_;
  EXPECT_EQ(kvtrim_register_model(engine_, messages, sizes, 1, digest, sizeof(digest), error_,
                                  sizeof(error_)),
            kInvalidArgument);  // no weights: W_O missing
  const void* garbage[] = {"\xff\xff"};
  const size_t garbage_size[] = {2};
  EXPECT_EQ(kvtrim_register_model(engine_, garbage, garbage_size, 1, digest, sizeof(digest), error_,
                                  sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("messages[0]:", 0), 0u) << error_;
}

}  // namespace
}  // namespace kvtrim

namespace kvtrim {
namespace {

/// The native client against a real kvtrimd on the CPU backend.
class KvtrimNativeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = testing::KvtrimdProcess::Start(
        KVTRIMD_PATH, {"--listen=127.0.0.1:0", "--metrics_listen=", "--backend=cpu"});
    ASSERT_TRUE(started.ok()) << started.status();
    server_.emplace(*std::move(started));
    auto addresses = server_->WaitUntilServing(absl::Seconds(60));
    ASSERT_TRUE(addresses.ok()) << addresses.status();
    ASSERT_EQ(
        kvtrim_client_connect(addresses->grpc.c_str(), 30, 0, nullptr, &client_, error_,
                              sizeof(error_)),
        0)
        << error_;
  }
  void TearDown() override { kvtrim_client_free(client_); }

  kvtrim_client* client_ = nullptr;
  std::optional<testing::KvtrimdProcess> server_;
  char error_[512] = {0};
};

TEST_F(KvtrimNativeClientTest, AnswersEqualTheEngineAndErrorsAreTheServers) {
  RandomLayer data(4, 300, 64, 8, 32, /*seed=*/5);
  kvtrim_layer layer{};
  layer.layer_id = 1;
  layer.keys = KvtrimCTest::Host(data.k.data(), 4, 300, 64);
  layer.values = KvtrimCTest::Host(data.v.data(), 4, 300, 64);
  layer.queries = KvtrimCTest::Host(data.q.data(), 8, 32, 64);
  kvtrim_engine* engine = nullptr;
  ASSERT_EQ(kvtrim_engine_create("cpu", 0, 1, "fast", &engine, error_, sizeof(error_)), 0);
  for (const std::string policy : {"dropkv", "snapkv+adakv"}) {
    const std::string settings = KvtrimCTest::Settings(policy, 0.25).SerializeAsString();
    void* answers[2] = {nullptr, nullptr};
    size_t sizes[2] = {0, 0};
    ASSERT_EQ(kvtrim_client_compress(client_, settings.data(), settings.size(), &layer, 1, nullptr,
                                     &answers[0], &sizes[0], error_, sizeof(error_)),
              0)
        << error_;
    ASSERT_EQ(kvtrim_compress(engine, settings.data(), settings.size(), &layer, 1, nullptr,
                              &answers[1], &sizes[1], error_, sizeof(error_)),
              0)
        << error_;
    v1::CompressResponse remote, local;
    ASSERT_TRUE(remote.ParseFromArray(answers[0], static_cast<int>(sizes[0])));
    ASSERT_TRUE(local.ParseFromArray(answers[1], static_cast<int>(sizes[1])));
    kvtrim_buffer_free(answers[0]);
    kvtrim_buffer_free(answers[1]);
    ASSERT_EQ(remote.layers_size(), 1);
    EXPECT_EQ(remote.layers(0).offsets().size(), local.layers(0).offsets().size());
    EXPECT_EQ(
        std::vector<int32_t>(remote.layers(0).indices().begin(), remote.layers(0).indices().end()),
        std::vector<int32_t>(local.layers(0).indices().begin(), local.layers(0).indices().end()))
        << policy;
  }
  kvtrim_engine_free(engine);

  // The server's refusal, code and message, as the RPC gives it.
  const std::string bad = KvtrimCTest::Settings("no_such_policy", 0.2).SerializeAsString();
  void* answer = nullptr;
  size_t size = 0;
  EXPECT_EQ(kvtrim_client_compress(client_, bad.data(), bad.size(), &layer, 1, nullptr, &answer,
                                   &size, error_, sizeof(error_)),
            kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("settings.policy.name:", 0), 0u) << error_;
  // A device tensor: CUDA builds map it (the GPU tests do); others refuse naming the field.
  kvtrim_layer device = layer;
  device.keys.device = 0;
  const std::string settings = KvtrimCTest::Settings("knorm", 0.5).SerializeAsString();
  const int32_t code = kvtrim_client_compress(client_, settings.data(), settings.size(), &device, 1,
                                              nullptr, &answer, &size, error_, sizeof(error_));
  EXPECT_NE(code, 0);
  EXPECT_EQ(std::string(error_).rfind("layers[0].keys.device:", 0), 0u) << error_;

  // A session: per-layer answers before finish, then every answer and the summary.
  kvtrim_session* session = nullptr;
  const std::string dropkv = KvtrimCTest::Settings("dropkv", 0.25).SerializeAsString();
  int32_t regions = -1;
  ASSERT_EQ(kvtrim_session_open(client_, dropkv.data(), dropkv.size(), 0, &regions, &session,
                                error_, sizeof(error_)),
            0)
      << error_;
  EXPECT_EQ(regions, 0);  // no lease asked for
  for (int32_t id : {0, 1}) {
    kvtrim_layer sent = layer;
    sent.layer_id = id;
    ASSERT_EQ(kvtrim_session_send(session, &sent, nullptr, error_, sizeof(error_)), 0) << error_;
  }
  ASSERT_EQ(kvtrim_session_answer(session, 1, &answer, &size, error_, sizeof(error_)), 0) << error_;
  v1::LayerResult one;
  ASSERT_TRUE(one.ParseFromArray(answer, static_cast<int>(size)));
  kvtrim_buffer_free(answer);
  EXPECT_EQ(one.layer_id(), 1);
  void* summary = nullptr;
  size_t summary_size = 0;
  ASSERT_EQ(kvtrim_session_finish(session, &answer, &size, &summary, &summary_size, error_,
                                  sizeof(error_)),
            0)
      << error_;
  v1::CompressResponse all;
  v1::SessionSummary totals;
  ASSERT_TRUE(all.ParseFromArray(answer, static_cast<int>(size)));
  ASSERT_TRUE(totals.ParseFromArray(summary, static_cast<int>(summary_size)));
  kvtrim_buffer_free(answer);
  kvtrim_buffer_free(summary);
  EXPECT_EQ(all.layers_size(), 2);
  EXPECT_EQ(totals.layers(), 2);
  EXPECT_EQ(totals.tokens_in(), 2 * 4 * 300);
  for (const v1::LayerResult& result : all.layers()) {
    if (result.layer_id() == 1) {
      EXPECT_EQ(result.SerializeAsString(), one.SerializeAsString());
    }
  }
  kvtrim_session_free(session);
  // A refused layer fails the session at its end, with the server's field.
  ASSERT_EQ(kvtrim_session_open(client_, dropkv.data(), dropkv.size(), 0, nullptr, &session, error_,
                                sizeof(error_)),
            0);
  kvtrim_layer short_values = layer;
  short_values.values.shape[1] = 10;
  ASSERT_EQ(kvtrim_session_send(session, &short_values, nullptr, error_, sizeof(error_)), 0);
  EXPECT_EQ(kvtrim_session_finish(session, &answer, &size, &summary, &summary_size, error_,
                                  sizeof(error_)),
            kInvalidArgument);
  EXPECT_NE(std::string(error_).find("values.shape"), std::string::npos) << error_;
  kvtrim_session_free(session);
  kvtrim_session_free(nullptr);

  kvtrim_client* other = nullptr;
  EXPECT_EQ(kvtrim_client_connect("", 30, 0, "", &other, error_, sizeof(error_)), kInvalidArgument);
  EXPECT_EQ(std::string(error_).rfind("target:", 0), 0u) << error_;
  EXPECT_EQ(kvtrim_client_compress(nullptr, settings.data(), settings.size(), &layer, 1, nullptr,
                                   &answer, &size, error_, sizeof(error_)),
            kInvalidArgument);
  kvtrim_client_free(nullptr);
}

}  // namespace
}  // namespace kvtrim
