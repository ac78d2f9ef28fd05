// The .npy writer and reader: numpy's exact header bytes, round trips and malformed input.
#include "formats/npy.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace kvtrim {
namespace {

TEST(NpyTest, HeaderMatchesNumpy) {
  // The bytes of np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)) (numpy 2.4): the dict,
  // 20 spaces of room for the first axis, padding to 128 bytes, '\n', then the data.
  NpyArray a{{2, 3}, {0, 1, 2, 3, 4, 5}};
  auto bytes = SerializeNpy(a);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(bytes->size(), 128u + 6 * 4);
  EXPECT_EQ(bytes->substr(0, 10), std::string("\x93NUMPY\x01\x00v\x00", 10));  // 118
  EXPECT_EQ(bytes->substr(10, dict.size()), dict);
  EXPECT_EQ(bytes->substr(10 + dict.size(), 127 - 10 - dict.size()),
            std::string(127 - 10 - dict.size(), ' '));
  EXPECT_EQ((*bytes)[127], '\n');
  float third;
  std::memcpy(&third, bytes->data() + 128 + 2 * 4, 4);
  EXPECT_EQ(third, 2.0f);
}

TEST(NpyTest, RoundTrips) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{99, 5, 4}, {7}, {}, {0, 3}, {2, 1, 1, 2}}) {
    NpyArray a;
    a.shape = shape;
    a.data.resize(static_cast<size_t>(a.NumElements()));
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = 0.25f * static_cast<float>(i) - 3.f;
    auto bytes = SerializeNpy(a);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ((bytes->size() - a.data.size() * 4) % 64, 0u);
    auto back = ParseNpy(*bytes, "mem");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape, a.shape);
    EXPECT_EQ(back->data, a.data);
  }
  NpyArray one{{7}, std::vector<float>(7, 1.f)};
  EXPECT_NE(SerializeNpy(one)->find("'shape': (7,)"), std::string::npos);
}

TEST(NpyTest, FileRoundTrip) {
  const std::string path = kvtrim::testing::TestPath("lukv_npy_test.npy");
  NpyArray a{{2, 2}, {1, 2, 3, 4}};
  ASSERT_TRUE(WriteNpy(path, a).ok());
  auto back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, a.data);
  std::remove(path.c_str());
  EXPECT_EQ(ReadNpy(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, RejectsMalformed) {
  NpyArray a{{2, 2}, {1, 2, 3, 4}};
  const std::string good = *SerializeNpy(a);
  EXPECT_FALSE(ParseNpy("garbage", "x").ok());
  EXPECT_FALSE(ParseNpy(good.substr(0, good.size() - 1), "x").ok());  // truncated data
  std::string f8 = good;
  f8.replace(f8.find("<f4"), 3, "<f8");
  EXPECT_FALSE(ParseNpy(f8, "x").ok());
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_FALSE(ParseNpy(fortran, "x").ok());
  EXPECT_FALSE(SerializeNpy(NpyArray{{3}, {1, 2}}).ok());
}

// Found by fuzz/npy_fuzz: a shape whose product overflowed int64 (undefined behaviour), or
// whose byte size wrapped to the data's size (e.g. 2^62 elements "in" 0 bytes, then
// resized to 2^62 floats), must be refused, not read.
TEST(NpyTest, RejectsShapesWhoseSizeOverflows) {
  NpyArray empty{{0}, {}};
  const std::string good = *SerializeNpy(empty);
  for (const char* shape : {"(3, 9223372036854775807)", "(4294967296, 4294967296)",
                            "(4611686018427387904,)", "(4294967296, 4294967296, 0)"}) {
    std::string bytes = good;
    bytes.replace(bytes.find("(0,)"), 4, shape);
    bytes.erase(bytes.find("}") + 1, std::string(shape).size() - 4);  // keep the length
    auto parsed = ParseNpy(bytes, "x");
    ASSERT_FALSE(parsed.ok()) << shape;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << shape;
  }
  // An empty array with a huge but representable extent is still fine.
  std::string zero = good;
  zero.replace(zero.find("(0,)"), 4, "(0, 9223372036854775807)");
  zero.erase(zero.find("}") + 1, 20);
  auto parsed = ParseNpy(zero, "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->data.size(), 0u);
}

}  // namespace
}  // namespace kvtrim
