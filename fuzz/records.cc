#include "fuzz/records.h"

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace kvtrim::fuzz {

namespace {

constexpr uint32_t kRecordTag = (1 << 3) | 2;  // field 1, length-delimited

}  // namespace

std::vector<absl::string_view> SplitRecords(const uint8_t* data, size_t size,
                                            size_t max_records) {
  std::vector<absl::string_view> records;
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  while (records.size() < max_records) {
    if (in.ReadTag() != kRecordTag) break;
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) break;
    const int position = in.CurrentPosition();
    if (length > size - static_cast<size_t>(position)) break;
    records.emplace_back(reinterpret_cast<const char*>(data) + position, length);
    if (!in.Skip(static_cast<int>(length))) break;
  }
  return records;
}

void AppendRecord(absl::string_view record, std::string* out) {
  google::protobuf::io::StringOutputStream stream(out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteTag(kRecordTag);
  coded.WriteVarint32(static_cast<uint32_t>(record.size()));
  coded.WriteRaw(record.data(), static_cast<int>(record.size()));
}

}  // namespace kvtrim::fuzz
