// RegisterModel stream assembly (service/model_codec.h), the content digest
// (service/model_digest.h) and the field-naming errors of BuildModel behind them.
#include "service/model_codec.h"

#include <openssl/sha.h>

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/client_text.h"
#include "service/model_digest.h"
#include "service/model_test_util.h"

namespace kvtrim::service::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kNoLimit = int64_t{1} << 40;

#define EXPECT_STATUS(status_expr, expected_code, fragment)                          \
  do {                                                                               \
    const absl::Status _s = (status_expr);                                           \
    EXPECT_EQ(_s.code(), (expected_code)) << _s;                                     \
    EXPECT_THAT(std::string(_s.message()), HasSubstr(fragment));                     \
  } while (0)

/// Feeds `stream` to an assembler; returns the first error or Finish's result.
absl::StatusOr<ModelInput> Assemble(const std::vector<v1::RegisterModelRequest>& stream,
                                    int64_t limit = kNoLimit) {
  ModelAssembler assembler(limit);
  for (const auto& message : stream) {
    if (auto st = assembler.Add(message); !st.ok()) return st;
  }
  return assembler.Finish();
}

ModelInput FullModel() {
  ModelInput input = MakeTestModelInput(2, 4, 2, 8, 32, /*seed=*/7, /*with_query_stats=*/true);
  AddTestProfile(&input, "snapkv", "snapkv", 4, 32, 3);
  return input;
}

TEST(ModelCodecTest, SameContentSameDigestWhateverTheChunking) {
  const ModelInput input = FullModel();
  const std::string expected = ComputeModelDigest(input);
  EXPECT_TRUE(IsWellFormedDigest(expected)) << expected;
  for (size_t chunk : {size_t{1} << 20, size_t{1000}, size_t{64}, size_t{7}}) {
    for (bool interleave : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "chunk " << chunk << " interleave " << interleave);
      auto assembled = Assemble(ToStream(input, chunk, interleave));
      ASSERT_TRUE(assembled.ok()) << assembled.status();
      EXPECT_EQ(ComputeModelDigest(*assembled), expected);
      EXPECT_EQ(assembled->tensors.size(), input.tensors.size());
      EXPECT_EQ(assembled->tensors.at("layers.1.query_cov").bytes,
                input.tensors.at("layers.1.query_cov").bytes);
      ASSERT_EQ(assembled->profiles.count("snapkv"), 1u);
      EXPECT_EQ(assembled->profiles.at("snapkv").metric, "snapkv");
      EXPECT_EQ(assembled->profiles.at("snapkv").sink, 4);
      EXPECT_EQ(assembled->profiles.at("snapkv").window, 32);
      EXPECT_TRUE(BuildModel(*std::move(assembled)).ok());
    }
  }
}

TEST(ModelCodecTest, DigestCoversEveryPart) {
  const ModelInput base = FullModel();
  const std::string digest = ComputeModelDigest(base);
  std::vector<ModelInput> variants(6, base);
  variants[0].layout.name = "other";
  variants[1].rope_theta = 500000.0;
  variants[2].tensors["layers.0.w_o"].bytes[5] ^= 1;
  variants[3].profiles["snapkv"].window = 16;
  variants[4].profiles["snapkv"].metric = "h2o";
  variants[5].rope_scaling_json = R"({"rope_type":"linear","factor":2.0})";
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(ComputeModelDigest(variants[i]), digest) << "variant " << i;
  }
  EXPECT_FALSE(IsWellFormedDigest("sha256:abc"));
  EXPECT_FALSE(IsWellFormedDigest(std::string("sha256:") + std::string(64, 'A')));
  EXPECT_TRUE(IsWellFormedDigest(std::string("sha256:") + std::string(64, 'a')));
}

/// The v2 canonical serialisation spelt out byte by byte from model_digest.h's comment,
/// hashed in one pass: an independent reading of the documented form.
std::string DigestAsDocumented(const ModelInput& input) {
  std::string out;
  const auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  const auto str = [&](const std::string& text) {
    u64(text.size());
    out += text;
  };
  const auto sha = [](const std::string& bytes) {
    unsigned char h[32];
    SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), h);
    return std::string(reinterpret_cast<const char*>(h), 32);
  };
  const auto tensor = [&](const RawTensor& t) {
    str(DTypeName(t.dtype));
    u64(t.shape.size());
    for (int64_t e : t.shape) u64(static_cast<uint64_t>(e));
    u64(t.bytes.size());
    out += sha(t.bytes);
  };
  str("kvtrim-model-v2");
  str(input.layout.name);
  for (int64_t v : {input.layout.num_layers, input.layout.num_query_heads,
                    input.layout.num_kv_heads, input.layout.head_dim, input.layout.hidden_size}) {
    u64(static_cast<uint64_t>(v));
  }
  uint64_t theta = 0;
  std::memcpy(&theta, &input.rope_theta, 8);
  u64(theta);
  str(input.rope_scaling_json);
  str(input.rope_layout);
  u64(input.tensors.size());
  for (const auto& [name, t] : input.tensors) {
    str(name);
    tensor(t);
  }
  u64(input.profiles.size());
  for (const auto& [name, p] : input.profiles) {
    str(name);
    str(p.metric);
    u64(static_cast<uint64_t>(p.sink));
    u64(static_cast<uint64_t>(p.window));
    tensor(p.ratios);
  }
  std::string hex = kDigestPrefix;
  for (unsigned char c : sha(out)) {
    static constexpr char kHex[] = "0123456789abcdef";
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 0xf]);
  }
  return hex;
}

TEST(ModelCodecTest, DigestIsTheDocumentedCanonicalForm) {
  ModelInput input = FullModel();
  input.rope_scaling_json = R"({"rope_type":"linear","factor":2.0})";
  input.rope_layout = "interleaved";
  EXPECT_EQ(ComputeModelDigest(input), DigestAsDocumented(input));
  // More tensors than cores: hashed side by side, still in name order.
  ModelInput wide = MakeTestModelInput(40, 4, 2, 8, 32, /*seed=*/3, /*with_query_stats=*/true);
  EXPECT_EQ(ComputeModelDigest(wide), DigestAsDocumented(wide));
  EXPECT_NE(ComputeLegacyModelDigest(input), ComputeModelDigest(input));
}

TEST(ModelCodecTest, HeaderComesFirstAndOnce) {
  const auto stream = ToStream(FullModel(), 1 << 20);
  std::vector<v1::RegisterModelRequest> weight_first(stream.begin() + 1, stream.end());
  EXPECT_STATUS(Assemble(weight_first).status(), absl::StatusCode::kInvalidArgument,
                "header: missing");
  auto twice = stream;
  twice.insert(twice.begin() + 2, stream[0]);
  EXPECT_STATUS(Assemble(twice).status(), absl::StatusCode::kInvalidArgument,
                "header: sent again");
  EXPECT_STATUS(Assemble({}).status(), absl::StatusCode::kInvalidArgument, "header: missing");
  auto empty = stream;
  empty.insert(empty.begin() + 1, v1::RegisterModelRequest());
  EXPECT_STATUS(Assemble(empty).status(), absl::StatusCode::kInvalidArgument,
                "message: RegisterModelRequest #2 is empty");
}

TEST(ModelCodecTest, HeaderTextsHaveLimits) {
  auto stream = ToStream(FullModel(), 1 << 20);
  auto long_name = stream;
  long_name[0].mutable_header()->set_name(std::string(5 << 20, 'n'));
  const absl::Status name = Assemble(long_name).status();
  EXPECT_STATUS(name, absl::StatusCode::kInvalidArgument,
                "header.name: 5242880 bytes, longer than the limit of 256: 'nnnn");
  EXPECT_THAT(std::string(name.message()), HasSubstr("...' (5242880 bytes)"));
  EXPECT_LT(name.message().size(), 512u);
  auto long_json = stream;
  long_json[0].mutable_header()->set_rope_scaling_json(std::string(5000, ' ') + "{}");
  EXPECT_STATUS(Assemble(long_json).status(), absl::StatusCode::kInvalidArgument,
                "header.rope_scaling_json: 5002 bytes, longer than the limit of 4096");
  auto long_layout = stream;
  long_layout[0].mutable_header()->set_rope_layout(std::string(33, 'r'));
  EXPECT_STATUS(Assemble(long_layout).status(), absl::StatusCode::kInvalidArgument,
                "header.rope_layout: 33 bytes, longer than the limit of 32");
}

TEST(ModelCodecTest, RopeScalingJsonErrorsSayWhy) {
  // BuildModel parses the JSON of an assembled registration.
  const auto build = [](const std::string& json) {
    auto stream = ToStream(FullModel(), 1 << 20);
    stream[0].mutable_header()->set_rope_scaling_json(json);
    auto input = Assemble(stream);
    EXPECT_TRUE(input.ok()) << input.status();
    return BuildModel(*std::move(input)).status();
  };
  const absl::Status overflow = build(R"({"factor": 1e999})");
  EXPECT_STATUS(overflow, absl::StatusCode::kInvalidArgument,
                "header.rope_scaling_json: not valid JSON (");
  EXPECT_THAT(std::string(overflow.message()), HasSubstr("number overflow"));
  EXPECT_STATUS(build("[1, 2]"), absl::StatusCode::kInvalidArgument,
                "header.rope_scaling_json: not a JSON object: '[1, 2]'");
  const absl::Status type = build("{\"rope_type\": \"" + std::string(3000, 't') + "\"}");
  EXPECT_STATUS(type, absl::StatusCode::kInvalidArgument,
                "header.rope_scaling_json: rope_type 'tttt");
  EXPECT_THAT(std::string(type.message()), HasSubstr("...' (3000 bytes) is not supported"));
}

TEST(ModelCodecTest, LongWeightNamesAreBoundedInTheField) {
  auto stream = ToStream(MakeTestModelInput(1, 4, 2, 8, 8, 1, false), 256);
  stream[1].mutable_weight()->set_name(std::string(300, 'w'));
  const absl::Status status = Assemble(stream).status();
  EXPECT_STATUS(status, absl::StatusCode::kInvalidArgument,
                "weights[" + std::string(kQuotedPrefixBytes, 'w') +
                    "...(300 bytes)].name: longer than 256");
}

/// The chunks of layers.0.w_o (1024 bytes) in 256-byte pieces: stream[1..4].
std::vector<v1::RegisterModelRequest> SmallStream() {
  return ToStream(MakeTestModelInput(1, 4, 2, 8, 8, 1, false), 256);
}

TEST(ModelCodecTest, OutOfOrderChunkNamesOffset) {
  auto stream = SmallStream();
  ASSERT_EQ(stream.size(), 5u);
  std::swap(stream[2], stream[3]);
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].offset_bytes: 512 leaves a gap");
  stream = SmallStream();
  std::swap(stream[1], stream[2]);  // a later chunk before the first one
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].offset_bytes: 256, but no earlier chunk");
}

TEST(ModelCodecTest, DuplicateOrOverlappingChunkNamesOffset) {
  auto stream = SmallStream();
  stream.insert(stream.begin() + 3, stream[2]);  // chunk [256, 512) twice
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].offset_bytes: 256 overlaps bytes already received");
  stream = SmallStream();
  stream[3].mutable_weight()->set_offset_bytes(500);
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].offset_bytes: 500 overlaps");
  stream = SmallStream();
  stream[4].mutable_weight()->mutable_data()->append("xxxx");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].offset_bytes: the chunk [768, 1028) runs past the end");
}

TEST(ModelCodecTest, IncompleteWeightAtTheEnd) {
  auto stream = SmallStream();
  stream.pop_back();
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].data: received 768 of 1024 bytes");
}

TEST(ModelCodecTest, FirstChunkDescribesTheWeight) {
  auto stream = SmallStream();
  stream[1].mutable_weight()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].dtype: DTYPE_UNSPECIFIED");
  stream = SmallStream();
  stream[1].mutable_weight()->clear_shape();
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].shape");
  stream = SmallStream();
  stream[1].mutable_weight()->set_shape(1, 0);
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].shape[1]: must be >= 1");
  stream = SmallStream();
  stream[2].mutable_weight()->add_shape(8);
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].shape: [8] differs");
  stream = SmallStream();
  stream[2].mutable_weight()->set_dtype(v1::DTYPE_BF16);
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].dtype: differs");
  stream = SmallStream();
  stream[1].mutable_weight()->set_manifest_json("{}");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].manifest_json: only profile.{name} weights");
}

TEST(ModelCodecTest, WeightNames) {
  auto stream = SmallStream();
  for (int i = 1; i < 5; ++i) stream[i].mutable_weight()->set_name("layers.0.wo");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.wo].name: unknown weight");
  for (int i = 1; i < 5; ++i) stream[i].mutable_weight()->set_name("layers.3.w_o");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.3.w_o].name: layer 3 is not below header.num_layers=1");
  for (int i = 1; i < 5; ++i) stream[i].mutable_weight()->set_name("");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[].name: empty");
  for (int i = 1; i < 5; ++i) stream[i].mutable_weight()->set_name("profile.");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[profile.].name: the profile name is empty");
}

TEST(ModelCodecTest, RegistrationSizeLimit) {
  // W_O of the small model is 1024 bytes.
  EXPECT_STATUS(Assemble(SmallStream(), 1000).status(), absl::StatusCode::kResourceExhausted,
                "exceeds --max_model_bytes=1000");
  EXPECT_TRUE(Assemble(SmallStream(), 1024).ok());
  ModelInput two = MakeTestModelInput(2, 4, 2, 8, 8, 1, false);  // 2 x 1024 bytes
  EXPECT_STATUS(Assemble(ToStream(two, 4096), 1500).status(),
                absl::StatusCode::kResourceExhausted, "more than --max_model_bytes=1500");
}

TEST(ModelCodecTest, ProfileManifests) {
  ModelInput input = FullModel();
  auto stream = ToStream(input, 1 << 20);
  v1::ModelWeightChunk* profile = stream.back().mutable_weight();
  ASSERT_EQ(profile->name(), "profile.snapkv");
  profile->set_manifest_json("{\"metric\": \"snapkv\", \"sink\": -1}");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[profile.snapkv].manifest_json.sink: must be an integer >= 0");
  profile->set_manifest_json("{\"metric\": \"snapkv\", \"windows\": 3}");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[profile.snapkv].manifest_json: unknown key 'windows'");
  profile->set_manifest_json("[1]");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[profile.snapkv].manifest_json: not a JSON object");
  // A manifest has a limit of its own (4096 bytes), the message's bounded quote.
  profile->set_manifest_json("{\"metric\": \"" + std::string(5000, 'm') + "\"}");
  EXPECT_STATUS(Assemble(stream).status(), absl::StatusCode::kInvalidArgument,
                "weights[profile.snapkv].manifest_json: 5014 bytes, longer than the limit of 4096");
  EXPECT_LT(Assemble(stream).status().message().size(), 1024u);
  profile->set_manifest_json("");
  auto assembled = Assemble(stream);
  ASSERT_TRUE(assembled.ok()) << assembled.status();
  EXPECT_EQ(assembled->profiles.at("snapkv").metric, "");
  EXPECT_EQ(CanonicalManifestJson(input.profiles.at("snapkv")),
            R"({"metric":"snapkv","sink":4,"window":32})");
}

// Found by fuzz/lukv_profile_fuzz: the message of a non-integer sink quoted the value with
// nlohmann's dump(), which recurses once per nesting level; a RegisterModel client's
// manifest of a deeply nested array overflowed kvtrimd's stack.
TEST(ModelCodecTest, DeeplyNestedManifestValueIsRefusedWithoutRecursion) {
  // Within the manifest's 4096-byte limit, as deep as it allows.
  const std::string nested = std::string(2040, '[') + std::string(2040, ']');
  EXPECT_STATUS(ParseProfileManifest("{\"sink\": " + nested + "}", "m").status(),
                absl::StatusCode::kInvalidArgument,
                "m.sink: must be an integer >= 0, got a JSON array");
  // The fuzzer's input itself is now refused by the limit before any parse.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_STATUS(ParseProfileManifest("{\"sink\": " + deep + "}", "m").status(),
                absl::StatusCode::kInvalidArgument, "m: 400010 bytes, longer than the limit");
  EXPECT_STATUS(ParseProfileManifest("{\"window\": 1.5}", "m").status(),
                absl::StatusCode::kInvalidArgument, "m.window: must be an integer >= 0, got '1.5'");
}

TEST(ModelCodecTest, WrongShapesNameTheField) {
  // W_O of a 1-layer model with H_q=4, d=8, D=8 must be [8, 32].
  auto stream = SmallStream();
  stream[1].mutable_weight()->set_shape(0, 16);
  stream[1].mutable_weight()->set_shape(1, 16);
  auto input = Assemble(stream);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_STATUS(BuildModel(*std::move(input)).status(), absl::StatusCode::kInvalidArgument,
                "weights[layers.0.w_o].shape: expected [8, 32], got [16, 16]");

  ModelInput model = MakeTestModelInput(1, 4, 2, 8, 8, 1, false);
  AddTestProfile(&model, "p", "snapkv", 4, 8, 1);
  model.profiles["p"].ratios.shape = {99, 2, 1};  // same bytes, wrong shape
  input = Assemble(ToStream(model, 1 << 20));
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_STATUS(BuildModel(*std::move(input)).status(), absl::StatusCode::kInvalidArgument,
                "weights[profile.p].shape: expected [99, 1, 2], got [99, 2, 1]");
}

TEST(ModelCodecTest, ModelInfoListsHeaderAndWeights) {
  ModelInput input = FullModel();
  auto model = BuildModel(input);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->digest = ComputeModelDigest(input);
  v1::ModelInfo info;
  EncodeModelInfo(**model, &info);
  EXPECT_EQ(info.digest(), (*model)->digest);
  EXPECT_EQ(info.header().name(), "test-model");
  EXPECT_EQ(info.header().num_layers(), 2);
  EXPECT_EQ(info.header().num_query_heads(), 4);
  EXPECT_EQ(info.header().num_kv_heads(), 2);
  EXPECT_EQ(info.header().head_dim(), 8);
  EXPECT_EQ(info.header().hidden_size(), 32);
  EXPECT_EQ(info.header().rope_theta(), 10000.0);
  EXPECT_THAT(std::vector<std::string>(info.weights().begin(), info.weights().end()),
              ::testing::ElementsAre("layers.0.query_cov", "layers.0.query_mean", "layers.0.w_o",
                                     "layers.1.query_cov", "layers.1.query_mean", "layers.1.w_o",
                                     "profile.snapkv"));
}

}  // namespace
}  // namespace kvtrim::service::testing
