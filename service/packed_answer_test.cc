// Packed answers (settings.answer_encoding = PACKED, LayerResult.packed): the encoder's byte
// format, and kvtrimd answering the same kept lists packed as repeated, for every output
// shape, unary and in sessions, on the CPU backend (the model-wide LaProx answers at finish:
// model_policies_test.cc).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvtrim/v1/packed_lists.h"
#include "service/response_codec.h"
#include "service/settings_codec.h"
#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

/// The CSR lists of `result`, from whichever form carried them.
struct Lists {
  std::vector<int64_t> offsets;
  std::vector<int32_t> indices;
  bool operator==(const Lists& o) const { return offsets == o.offsets && indices == o.indices; }
};

Lists ListsOf(const v1::LayerResult& result) {
  Lists out;
  if (!result.has_packed()) {
    out.offsets.assign(result.offsets().begin(), result.offsets().end());
    out.indices.assign(result.indices().begin(), result.indices().end());
    return out;
  }
  const v1::PackedLists& p = result.packed();
  EXPECT_EQ(result.offsets_size(), 0);
  EXPECT_EQ(result.indices_size(), 0);
  EXPECT_EQ(p.index_bytes(), v1::PackedIndexBytes(result.num_tokens()));
  EXPECT_EQ(p.offsets().size() % 8, 0u);
  EXPECT_EQ(p.indices().size() % p.index_bytes(), 0u);
  for (size_t i = 0; i < p.offsets().size() / 8; ++i) {
    out.offsets.push_back(static_cast<int64_t>(v1::LoadLittleEndian(p.offsets().data() + 8 * i, 8)));
  }
  out.indices.resize(p.indices().size() / p.index_bytes());
  v1::UnpackIndices(p.indices().data(), out.indices.size(), p.index_bytes(), out.indices.data());
  return out;
}

TEST(PackedAnswerCodec, WidthFollowsTheLayerLengthAndBytesAreLittleEndian) {
  for (int64_t n : {1, 7, 65536, 65537, 131072, 16777216, 16777217}) {
    LayerDecision d;
    d.layer_id = 3;
    d.num_tokens = n;
    d.output_shape = OutputShape::kPerHead;
    d.offsets = {0, 2, 3};
    d.indices = {0, static_cast<int32_t>(n - 1), static_cast<int32_t>(n / 2)};
    d.kept_per_head = {2, 1};
    v1::LayerResult repeated, packed;
    EncodeLayerResult(d, &repeated);
    EncodeLayerResult(d, &packed, /*packed=*/true);
    EXPECT_FALSE(repeated.has_packed());
    ASSERT_TRUE(packed.has_packed());
    const uint32_t width = n <= 65536 ? 2 : 4;
    EXPECT_EQ(packed.packed().index_bytes(), width) << n;
    EXPECT_EQ(packed.packed().indices().size(), 3 * width);
    EXPECT_EQ(packed.packed().offsets().size(), 3 * 8u);
    // The largest index, n - 1, byte by byte (least significant first).
    const std::string& bytes = packed.packed().indices();
    uint64_t last = 0;
    for (uint32_t b = 0; b < width; ++b) {
      last |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[width + b])) << (8 * b);
    }
    EXPECT_EQ(last, static_cast<uint64_t>(n - 1));
    EXPECT_TRUE(ListsOf(packed) == ListsOf(repeated)) << n;
    // Everything but the lists is the same.
    EXPECT_EQ(packed.heads_size(), repeated.heads_size());
    EXPECT_EQ(packed.num_tokens(), repeated.num_tokens());
  }
}

TEST(PackedAnswerCodec, SettingsDecodeTheEncodingAndNameAnUnknownOne) {
  v1::CompressionSettings settings = MakeSettings("knorm");
  auto decoded = DecodeSettings(settings, "settings", Numerics::kExact);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->packed_answer);
  settings.set_answer_encoding(v1::ANSWER_ENCODING_REPEATED);
  EXPECT_FALSE(DecodeSettings(settings, "settings", Numerics::kExact)->packed_answer);
  settings.set_answer_encoding(v1::ANSWER_ENCODING_PACKED);
  EXPECT_TRUE(DecodeSettings(settings, "settings", Numerics::kExact)->packed_answer);
  settings.set_answer_encoding(static_cast<v1::AnswerEncoding>(7));
  auto bad = DecodeSettings(settings, "settings", Numerics::kExact);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("settings.answer_encoding"), std::string::npos)
      << bad.status();
}

/// One request per output shape the test covers.
struct ShapeCase {
  const char* policy;
  v1::OutputShape shape;
};

TEST(PackedAnswerRpc, SameListsPackedAndRepeatedForEveryShape) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  LayerDims dims;
  dims.tokens = 300;
  for (const ShapeCase& c : {ShapeCase{"snapkv", v1::PER_HEAD}, ShapeCase{"knorm", v1::SHARED},
                             ShapeCase{"snapkv", v1::BLOCK_ALIGNED},
                             ShapeCase{"snapkv", v1::EQUAL_COUNT},
                             ShapeCase{"adakv", v1::PER_HEAD}}) {
    v1::CompressRequest request = MakeRequest(c.policy, 3, dims);
    request.mutable_settings()->set_output_shape(c.shape);
    if (c.shape == v1::BLOCK_ALIGNED) request.mutable_settings()->set_block_size(16);
    v1::CompressResponse repeated, packed;
    ASSERT_TRUE(CallCompress(*stub, request, &repeated).ok()) << c.policy << " " << c.shape;
    request.mutable_settings()->set_answer_encoding(v1::ANSWER_ENCODING_PACKED);
    const grpc::Status st = CallCompress(*stub, request, &packed);
    ASSERT_TRUE(st.ok()) << c.policy << " " << c.shape << ": " << st.error_message();
    ASSERT_EQ(packed.layers_size(), repeated.layers_size());
    for (int l = 0; l < packed.layers_size(); ++l) {
      ASSERT_TRUE(packed.layers(l).has_packed());
      EXPECT_EQ(packed.layers(l).packed().index_bytes(), 2u);
      EXPECT_TRUE(ListsOf(packed.layers(l)) == ListsOf(repeated.layers(l)))
          << c.policy << " shape " << c.shape << " layer " << l;
      EXPECT_FALSE(ListsOf(packed.layers(l)).indices.empty());
    }
  }
}

TEST(PackedAnswerRpc, SessionsAnswerPacked) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  v1::CompressRequest request = MakeRequest("snapkv", 3);
  std::vector<v1::SessionResponse> repeated, packed;
  ASSERT_TRUE(CallSession(*stub, request, true, &repeated).ok());
  request.mutable_settings()->set_answer_encoding(v1::ANSWER_ENCODING_PACKED);
  ASSERT_TRUE(CallSession(*stub, request, true, &packed).ok());
  ASSERT_EQ(packed.size(), repeated.size());
  int layers = 0;
  for (size_t i = 0; i < packed.size(); ++i) {
    if (!packed[i].has_layer()) continue;
    ++layers;
    ASSERT_TRUE(packed[i].layer().has_packed());
    EXPECT_TRUE(ListsOf(packed[i].layer()) == ListsOf(repeated[i].layer())) << i;
  }
  EXPECT_EQ(layers, 3);
}

}  // namespace
}  // namespace kvtrim::service::testing
