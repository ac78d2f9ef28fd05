// A stream of messages in one fuzz input: the wire bytes of `message Records { repeated bytes
// record = 1; }`, i.e. each record as tag 0x0A, a varint length and the record's bytes. The
// session and RegisterModel targets read one message of their stream per record; the corpus
// generator writes them with AppendRecord.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvtrim::fuzz {

/// The records of `input`, at most `max_records`, each a view into `input`. Reading stops
/// at the first field that is not a well-formed record 1 (the rest is ignored).
std::vector<absl::string_view> SplitRecords(const uint8_t* data, size_t size,
                                            size_t max_records);

/// Appends `record` to `out` as one record (the inverse of SplitRecords).
void AppendRecord(absl::string_view record, std::string* out);

}  // namespace kvtrim::fuzz
