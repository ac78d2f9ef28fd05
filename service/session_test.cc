// CompressSession: ordering rules, streaming answers, summary and errors.
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

using grpc::StatusCode;
using Stream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>;

constexpr auto Begin = SessionBegin;
constexpr auto Layer = SessionLayer;
constexpr auto Finish = SessionFinish;

/// Reads until the server closes the stream; returns the final status.
grpc::Status Drain(Stream& stream, std::vector<v1::SessionResponse>* responses = nullptr) {
  v1::SessionResponse response;
  while (stream.Read(&response)) {
    if (responses) responses->push_back(response);
  }
  return stream.Finish();
}

class SessionTest : public SharedServerTest {
 protected:
  void SetUp() override {
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub_->CompressSession(context_.get());
  }

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(SessionTest, AnswersEachLayerBeforeTheNextIsSent) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("snapkv"))));
  for (int id : {2, 0, 1}) {
    ASSERT_TRUE(stream_->Write(Layer(MakeLayer(id))));
    v1::SessionResponse response;
    ASSERT_TRUE(stream_->Read(&response));  // streamed before the next layer is sent
    ASSERT_TRUE(response.has_layer());
    EXPECT_EQ(response.layer().layer_id(), id);
    EXPECT_EQ(response.layer().heads_size(), 2);
  }
  ASSERT_TRUE(stream_->Write(Finish()));
  stream_->WritesDone();
  std::vector<v1::SessionResponse> rest;
  ASSERT_TRUE(Drain(*stream_, &rest).ok());
  ASSERT_EQ(rest.size(), 1u);
  ASSERT_TRUE(rest[0].has_finished());
  EXPECT_EQ(rest[0].finished().layers(), 3);
  EXPECT_EQ(rest[0].finished().tokens_in(), 3 * 2 * 64);
  EXPECT_EQ(rest[0].finished().tokens_kept(), 3 * 2 * 32);
  EXPECT_EQ(rest[0].finished().backend(), "cpu");
}

TEST_F(SessionTest, SessionMatchesUnaryCompress) {
  v1::CompressResponse unary;
  v1::CompressRequest request = MakeRequest("dropkv", 3);
  request.mutable_settings()->set_num_layers(3);
  ASSERT_TRUE(CallCompress(*stub_, request, &unary).ok());
  ASSERT_TRUE(stream_->Write(Begin(request.settings())));
  for (const auto& layer : request.layers()) ASSERT_TRUE(stream_->Write(Layer(layer)));
  ASSERT_TRUE(stream_->Write(Finish()));
  stream_->WritesDone();
  std::vector<v1::SessionResponse> responses;
  ASSERT_TRUE(Drain(*stream_, &responses).ok());
  ASSERT_EQ(responses.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(responses[i].layer().indices().size(), unary.layers(i).indices().size());
    EXPECT_TRUE(std::equal(responses[i].layer().indices().begin(),
                           responses[i].layer().indices().end(),
                           unary.layers(i).indices().begin()));
    EXPECT_TRUE(std::equal(responses[i].layer().offsets().begin(),
                           responses[i].layer().offsets().end(),
                           unary.layers(i).offsets().begin()));
  }
}

TEST_F(SessionTest, PyramidWithUnknownNumLayersUsesLayersSeen) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("pyramidkv"))));  // num_layers = 0
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(0))));
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(5))));
  ASSERT_TRUE(stream_->Write(Finish()));
  stream_->WritesDone();
  std::vector<v1::SessionResponse> responses;
  ASSERT_TRUE(Drain(*stream_, &responses).ok());
  ASSERT_EQ(responses.size(), 3u);
  EXPECT_EQ(responses[2].finished().layers(), 2);
}

TEST_F(SessionTest, LayerBeforeBegin) {
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(0))));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::FAILED_PRECONDITION,
                    "layer: received before begin");
}

TEST_F(SessionTest, FinishBeforeBegin) {
  ASSERT_TRUE(stream_->Write(Finish()));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::FAILED_PRECONDITION,
                    "finish: received before begin");
}

TEST_F(SessionTest, SecondBegin) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("knorm"))));
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("knorm"))));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::FAILED_PRECONDITION,
                    "begin: the session has already begun");
}

TEST_F(SessionTest, DuplicateLayerId) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("knorm"))));
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(3))));
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(3))));
  stream_->WritesDone();
  std::vector<v1::SessionResponse> responses;
  EXPECT_GRPC_ERROR(Drain(*stream_, &responses), StatusCode::INVALID_ARGUMENT,
                    "layer.layer_id: duplicate layer_id 3");
  ASSERT_EQ(responses.size(), 2u);  // the first layer 3 was answered, then the error
  EXPECT_TRUE(responses[0].has_layer());
  ASSERT_TRUE(responses[1].has_error());
  EXPECT_EQ(responses[1].error().code(), static_cast<int32_t>(StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(responses[1].error().message().find("duplicate layer_id 3"), std::string::npos);
}

TEST_F(SessionTest, ClosedWithoutFinish) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("knorm"))));
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(0))));
  stream_->WritesDone();
  std::vector<v1::SessionResponse> responses;
  EXPECT_GRPC_ERROR(Drain(*stream_, &responses), StatusCode::INVALID_ARGUMENT,
                    "finish: the client closed the stream without sending finish");
  ASSERT_EQ(responses.size(), 2u);  // layer 0's answer, then the error
  EXPECT_TRUE(responses[0].has_layer());
  EXPECT_TRUE(responses[1].has_error());
}

TEST_F(SessionTest, EmptyMessage) {
  ASSERT_TRUE(stream_->Write(v1::SessionRequest()));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::INVALID_ARGUMENT, "message: empty SessionRequest");
}

TEST_F(SessionTest, BadBeginNamesBegin) {
  auto settings = MakeSettings("snapkv");
  settings.mutable_budget()->set_keep_fraction(2);
  ASSERT_TRUE(stream_->Write(Begin(settings)));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::INVALID_ARGUMENT, "begin.budget.keep_fraction");
}

TEST_F(SessionTest, UnknownPolicyNamesBegin) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("nope"))));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::INVALID_ARGUMENT, "begin.policy.name");
}

TEST_F(SessionTest, ModelDigestIsUnknown) {
  auto settings = MakeSettings("knorm");
  settings.set_model_digest("sha256:00");
  ASSERT_TRUE(stream_->Write(Begin(settings)));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::FAILED_PRECONDITION,
                    "begin.model_digest: unknown model digest");
}

TEST_F(SessionTest, BadLayerNamesLayer) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("snapkv"))));
  LayerDims dims;
  dims.query_heads = 3;
  ASSERT_TRUE(stream_->Write(Layer(MakeLayer(0, dims))));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::INVALID_ARGUMENT, "layer.queries.shape[0]");
}

TEST_F(SessionTest, NaNInLayerNamesLayer) {
  ASSERT_TRUE(stream_->Write(Begin(MakeSettings("knorm"))));
  auto layer = MakeLayer(0);
  std::vector<float> keys = Values(2 * 64 * 8, 5);
  keys[0] = std::nanf("");
  *layer.mutable_keys() = MakeTensor(v1::DTYPE_F32, {2, 64, 8}, keys);
  ASSERT_TRUE(stream_->Write(Layer(layer)));
  stream_->WritesDone();
  EXPECT_GRPC_ERROR(Drain(*stream_), StatusCode::INVALID_ARGUMENT, "layer.keys: contains NaN");
}

TEST(SessionDeadlineTest, DeadlineAlreadyExpired) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  auto stream = stub->CompressSession(&context);
  stream->Write(Begin(MakeSettings("knorm")));
  stream->WritesDone();
  v1::SessionResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), StatusCode::DEADLINE_EXCEEDED);
}

TEST(SessionDeadlineTest, DeadlinePassingMidSessionEndsIt) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  auto stream = stub->CompressSession(&context);
  ASSERT_TRUE(stream->Write(Begin(MakeSettings("knorm"))));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // idle past the deadline
  stream->Write(Layer(MakeLayer(0)));
  stream->WritesDone();
  v1::SessionResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), StatusCode::DEADLINE_EXCEEDED);
  // The server is free again: the abandoned session released its slot.
  for (int i = 0; i < 500 && server->service().inflight() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server->service().inflight(), 0);
}

}  // namespace
}  // namespace kvtrim::service::testing
