// Tests of the safetensors reader and writer: round trips, the bundled Python-written sample,
// and malformed files with the exact error code and a message fragment naming the problem.
#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/test_dir.h"

namespace kvtrim {
namespace {

/// A little-endian 8-byte length followed by `header` and `data`.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

SafetensorsFile SampleFile() {
  SafetensorsFile file;
  SafetensorsTensor keys;  // [2, 3, 2] f32
  keys.dtype = DType::kF32;
  keys.shape = {2, 3, 2};
  for (int i = 0; i < 12; ++i) {
    float v = 0.5f * i - 1.0f;
    keys.data.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  SafetensorsTensor half;  // [4] bf16
  half.dtype = DType::kBF16;
  half.shape = {4};
  half.data = std::string("\x80\x3f\x00\x40\x40\x40\x80\x40", 8);
  SafetensorsTensor scalar;  // [] f16
  scalar.dtype = DType::kF16;
  scalar.data = std::string("\x00\x3c", 2);
  file.tensors["layer.0.keys"] = keys;
  file.tensors["b"] = half;
  file.tensors["s"] = scalar;
  file.metadata["model"] = "test";
  return file;
}

TEST(SafetensorsTest, RoundTripKeepsEveryField) {
  const SafetensorsFile file = SampleFile();
  absl::StatusOr<std::string> bytes = SerializeSafetensors(file);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ((bytes->size() - 8 - 12 * 4 - 8 - 2) % 8, 0u) << "header padded to 8 bytes";
  absl::StatusOr<SafetensorsFile> back = ParseSafetensors(*bytes, "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata, file.metadata);
  ASSERT_EQ(back->tensors.size(), 3u);
  for (const auto& [name, tensor] : file.tensors) {
    const SafetensorsTensor& got = back->tensors.at(name);
    EXPECT_EQ(got.dtype, tensor.dtype) << name;
    EXPECT_EQ(got.shape, tensor.shape) << name;
    EXPECT_EQ(got.data, tensor.data) << name;
  }
  EXPECT_EQ(back->tensors.at("s").NumElements(), 1);
}

TEST(SafetensorsTest, WritesAndReadsAFile) {
  const std::string path = kvtrim::testing::TestPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, SampleFile()).ok());
  absl::StatusOr<SafetensorsFile> back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tensors.at("layer.0.keys").data, SampleFile().tensors.at("layer.0.keys").data);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, ReadsTheBundledSampleWrittenByPython) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(KVTRIM_SAMPLE_PATH);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.size(), 15u);
  EXPECT_EQ(file->metadata.at("n"), "256");
  EXPECT_EQ(file->metadata.at("w"), "32");
  for (int l = 0; l < 5; ++l) {
    const auto& keys = file->tensors.at(absl::StrCat("layer.", l, ".keys"));
    const auto& values = file->tensors.at(absl::StrCat("layer.", l, ".values"));
    const auto& queries = file->tensors.at(absl::StrCat("layer.", l, ".queries"));
    EXPECT_EQ(keys.shape, (std::vector<int64_t>{4, 256, 8}));
    EXPECT_EQ(values.shape, (std::vector<int64_t>{4, 256, 8}));
    EXPECT_EQ(queries.shape, (std::vector<int64_t>{8, 32, 8}));
    EXPECT_EQ(keys.dtype, DType::kF32);
  }
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors("/nonexistent/x.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("cannot open"), std::string::npos);
}

/// Parses `bytes` and expects INVALID_ARGUMENT whose message contains `fragment`.
void ExpectInvalid(const std::string& bytes, const std::string& fragment) {
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(bytes, "bad");
  ASSERT_FALSE(file.ok()) << "expected an error containing: " << fragment;
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find(fragment), std::string::npos) << file.status();
  EXPECT_NE(file.status().message().find("safetensors \"bad\""), std::string::npos);
}

TEST(SafetensorsTest, RejectsShortFile) { ExpectInvalid("abc", "fewer than the 8-byte"); }

TEST(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  std::string bytes = RawFile("{}", "");
  bytes[0] = 100;
  ExpectInvalid(bytes, "header length 100 exceeds the file");
  std::string huge(8, '\xff');
  ExpectInvalid(huge + "{}", "exceeds the file");
}

TEST(SafetensorsTest, RejectsNonJsonHeader) {
  ExpectInvalid(RawFile("{not json", ""), "header is not a JSON object");
  ExpectInvalid(RawFile("[1, 2]", ""), "header is not a JSON object");
}

TEST(SafetensorsTest, RejectsUnsupportedDType) {
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                        std::string(8, '\0')),
                "tensor \"t\": dtype \"F64\" is not supported");
}

TEST(SafetensorsTest, RejectsBadShape) {
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                        std::string(4, '\0')),
                "tensor \"t\": shape [-1] has a non-integer or negative extent");
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
                "tensor \"t\": \"shape\" is missing");
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                        R"("data_offsets":[0,4]}})",
                        std::string(4, '\0')),
                "tensor \"t\": shape [4294967296,4294967296,16] is too large");
}

// Found by fuzz/safetensors_fuzz: a shape whose element count overflows before a zero
// extent was accepted as empty, and SerializeSafetensors (NumElements) then overflowed int64.
TEST(SafetensorsTest, RejectsShapesThatOverflowBeforeAZeroExtent) {
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,0],)"
                        R"("data_offsets":[0,0]}})",
                        ""),
                "tensor \"t\": shape [4294967296,4294967296,0] is too large");
  // A zero extent first: an empty tensor, which round-trips.
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(
      RawFile(R"({"t":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})",
              ""),
      "empty");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors.at("t").NumElements(), 0);
  absl::StatusOr<std::string> bytes = SerializeSafetensors(*file);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(ParseSafetensors(*bytes, "again").ok());
}

// Found by fuzz/safetensors_fuzz: the message of a bad extent printed the shape with
// nlohmann's dump(), which recurses once per nesting level; a deeply nested shape overflowed
// the stack (the CLI's inputs, kvtrimd's model files at start-up).
TEST(SafetensorsTest, RejectsADeeplyNestedShapeWithoutRecursion) {
  const std::string nested = std::string(200000, '[') + std::string(200000, ']');
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[1,)" + nested +
                            R"(],"data_offsets":[0,4]}})",
                        std::string(4, '\0')),
                "tensor \"t\": shape [...] (holding arrays or objects) has a non-integer");
}

TEST(SafetensorsTest, RejectsOffsetsOutsideTheData) {
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                        std::string(4, '\0')),
                "tensor \"t\": data_offsets [0, 8] lie outside the data section (4 bytes)");
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",
                        std::string(4, '\0')),
                "tensor \"t\": data_offsets [4, 0]");
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
                        std::string(4, '\0')),
                "tensor \"t\": \"data_offsets\" must be two non-negative integers");
}

TEST(SafetensorsTest, RejectsSizeMismatch) {
  ExpectInvalid(RawFile(R"({"t":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})",
                        std::string(8, '\0')),
                "tensor \"t\": data_offsets [0, 8] hold 8 bytes but shape [3] of F16 needs 6");
}

TEST(SafetensorsTest, RejectsOverlapGapAndTrailingBytes) {
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string(8, '\0')),
                "tensor \"b\": data_offsets start at 4, overlapping");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        std::string(8, '\0')),
                "tensor \"a\": data_offsets start at 4, leaving a gap");
  ExpectInvalid(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                        std::string(8, '\0')),
                "the tensors cover 4 bytes of a 8-byte data section");
}

TEST(SafetensorsTest, RejectsNonStringMetadata) {
  ExpectInvalid(RawFile(R"({"__metadata__":{"n":256}})", ""), "__metadata__ \"n\" is not a string");
}

TEST(SafetensorsTest, WriterRejectsDataThatDoesNotMatchTheShape) {
  SafetensorsFile file = SampleFile();
  file.tensors["layer.0.keys"].data.resize(5);
  absl::StatusOr<std::string> bytes = SerializeSafetensors(file);
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("tensor \"layer.0.keys\": 5 bytes of data but shape "
                                          "[2, 3, 2] of F32 needs 48"),
            std::string::npos)
      << bytes.status();
}

}  // namespace
}  // namespace kvtrim
