// Tests of SharedMemorySegment and the segment name rule.
#include "client/shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace kvtrim {
namespace {

/// True when a segment called `name` exists (it can be opened).
bool SegmentExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmNameTest, AcceptsTheRule) {
  EXPECT_TRUE(ValidateShmName("/a").ok());
  EXPECT_TRUE(ValidateShmName("/kvtrim-Worker_0.seg-12").ok());
  EXPECT_TRUE(ValidateShmName("/" + std::string(250, 'x')).ok());
}

TEST(ShmNameTest, RejectsBadNames) {
  for (const std::string& name :
       {std::string(""), std::string("/"), std::string("noslash"), std::string("/a/b"),
        std::string("/sp ace"), std::string("/" + std::string(251, 'x')),
        std::string("/\xc3\xa9")}) {
    absl::Status status = ValidateShmName(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(status.message().find("name"), absl::string_view::npos) << status;
  }
}

TEST(ShmNameTest, UniqueNamesFollowTheRuleAndDiffer) {
  const std::string a = UniqueShmName("test");
  const std::string b = UniqueShmName("test");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("/kvtrim-test-" + std::to_string(getpid()) + "-", 0), 0u) << a;
  EXPECT_TRUE(ValidateShmName(a).ok());
  const std::string odd = UniqueShmName("we/ird name");
  EXPECT_TRUE(ValidateShmName(odd).ok()) << odd;
  EXPECT_NE(odd.find("we_ird_name"), std::string::npos) << odd;
}

TEST(SharedMemorySegmentTest, CreatesWritableSegmentThatOthersSee) {
  const std::string name = UniqueShmName("test");
  absl::StatusOr<std::unique_ptr<SharedMemorySegment>> segment =
      SharedMemorySegment::Create(name, 8192);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ((*segment)->name(), name);
  EXPECT_EQ((*segment)->size(), 8192u);
  ASSERT_NE((*segment)->data(), nullptr);
  std::memcpy(static_cast<char*>((*segment)->data()) + 4000, "kvtrim", 6);

  // A second, read-only mapping (as kvtrimd opens it) sees the bytes.
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  void* view = mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<char*>(view) + 4000, "kvtrim", 6), 0);
  EXPECT_EQ(static_cast<char*>(view)[0], 0);  // zero-filled
  munmap(view, 8192);
}

TEST(SharedMemorySegmentTest, DestructionUnlinksTheName) {
  const std::string name = UniqueShmName("test");
  {
    auto segment = SharedMemorySegment::Create(name, 4096);
    ASSERT_TRUE(segment.ok()) << segment.status();
    EXPECT_TRUE(SegmentExists(name));
  }
  EXPECT_FALSE(SegmentExists(name));
}

TEST(SharedMemorySegmentTest, ExistingNameIsAlreadyExists) {
  const std::string name = UniqueShmName("test");
  auto first = SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SharedMemorySegment::Create(name, 4096);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find(name), absl::string_view::npos);
  // The failed attempt must not have removed the first segment's name.
  EXPECT_TRUE(SegmentExists(name));
}

TEST(SharedMemorySegmentTest, RejectsBadNameAndZeroSize) {
  EXPECT_EQ(SharedMemorySegment::Create("bad", 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status zero = SharedMemorySegment::Create(UniqueShmName("test"), 0).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("bytes"), absl::string_view::npos);
}

}  // namespace
}  // namespace kvtrim
