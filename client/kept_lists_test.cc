// KeptLists: the same lists read in place from repeated fields and from packed bytes of
// either width, and malformed answers refused with DATA_LOSS naming the field.
#include "client/kept_lists.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvtrim/v1/packed_lists.h"

namespace kvtrim {
namespace {

const std::vector<int64_t> kOffsets = {0, 3, 3, 5};
const std::vector<int32_t> kIndices = {1, 7, 65535, 0, 4};

/// A LayerResult of n tokens carrying kOffsets / kIndices repeated, or packed `width` wide.
v1::LayerResult Result(int64_t n, uint32_t width) {
  v1::LayerResult r;
  r.set_num_tokens(n);
  if (width == 0) {
    r.mutable_offsets()->Add(kOffsets.begin(), kOffsets.end());
    r.mutable_indices()->Add(kIndices.begin(), kIndices.end());
    return r;
  }
  v1::PackedLists* p = r.mutable_packed();
  v1::PackOffsets(kOffsets.data(), kOffsets.size(), p->mutable_offsets());
  v1::PackIndices(kIndices.data(), kIndices.size(), width, p->mutable_indices());
  p->set_index_bytes(width);
  return r;
}

TEST(KeptListsTest, RepeatedAndPackedReadTheSameLists) {
  for (const auto& [n, width] : {std::pair<int64_t, uint32_t>{65536, 0}, {65536, 2},
                                 {100000, 4}, {65536, 4}}) {
    const v1::LayerResult r = Result(n, width);
    absl::StatusOr<KeptLists> lists = KeptLists::Of(r);
    ASSERT_TRUE(lists.ok()) << lists.status();
    EXPECT_EQ(lists->packed(), width != 0);
    ASSERT_EQ(lists->num_lists(), 3);
    EXPECT_EQ(lists->num_indices(), 5);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(lists->offset(i), kOffsets[i]);
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(lists->index(i), kIndices[i]) << width;
    EXPECT_EQ(lists->List(0), (std::vector<int32_t>{1, 7, 65535}));
    EXPECT_TRUE(lists->List(1).empty());
    EXPECT_EQ(lists->List(2), (std::vector<int32_t>{0, 4}));
    std::vector<int32_t> all(5);
    lists->CopyIndices(0, 5, all.data());
    EXPECT_EQ(all, kIndices);
    std::vector<int32_t> tail(2);
    lists->CopyIndices(3, 5, tail.data());  // ends at the buffer's last byte
    EXPECT_EQ(tail, (std::vector<int32_t>{0, 4}));
  }
}

TEST(KeptListsTest, MalformedAnswersNameTheField) {
  struct Case {
    v1::LayerResult result;
    const char* fragment;
  };
  std::vector<Case> cases;
  {
    v1::LayerResult r = Result(100, 2);
    r.mutable_packed()->set_index_bytes(3);
    cases.push_back({r, "layers[2].packed.index_bytes: must be 2 or 4, got 3"});
  }
  {
    v1::LayerResult r = Result(70000, 2);
    cases.push_back({r, "layers[2].packed.index_bytes: 2 cannot hold the indices of n = 70000"});
  }
  {
    v1::LayerResult r = Result(100, 2);
    r.mutable_packed()->mutable_offsets()->pop_back();
    cases.push_back({r, "layers[2].packed.offsets: 31 bytes is not a whole number of int64"});
  }
  {
    v1::LayerResult r = Result(100, 4);
    r.mutable_packed()->mutable_indices()->append("x");
    cases.push_back({r, "layers[2].packed.indices: 21 bytes is not a whole number of 4-byte"});
  }
  {
    v1::LayerResult r = Result(100, 2);
    r.add_indices(1);
    cases.push_back({r, "layers[2].packed: sent beside repeated offsets / indices"});
  }
  {
    v1::LayerResult r = Result(100, 0);
    r.set_offsets(0, 1);
    cases.push_back({r, "layers[2].offsets: offset 0 is 1"});
  }
  {
    v1::LayerResult r = Result(100, 0);
    r.set_offsets(2, 2);
    cases.push_back({r, "layers[2].offsets: offset 2 is 2 after 3"});
  }
  {
    v1::LayerResult r = Result(100, 0);
    r.add_indices(9);
    cases.push_back({r, "layers[2].offsets: end at 5 but 6 indices were sent"});
  }
  {
    v1::LayerResult r;
    r.add_offsets(0);
    cases.push_back({r, "layers[2].offsets: needs at least 2 offsets, got 1"});
  }
  for (const Case& c : cases) {
    absl::StatusOr<KeptLists> lists = KeptLists::Of(c.result, "layers[2]");
    ASSERT_FALSE(lists.ok()) << c.fragment;
    EXPECT_EQ(lists.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(lists.status().message().find(c.fragment), absl::string_view::npos)
        << lists.status() << "\n  expected: " << c.fragment;
  }
}

}  // namespace
}  // namespace kvtrim
