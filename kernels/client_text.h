// Client-supplied values as they appear in status messages: strings bounded (a quoted,
// escaped prefix plus the length), numbers printed exactly. A message that echoed a client's
// 16 KiB policy name whole would exceed gRPC's trailer limit, and the caller would see
// RESOURCE_EXHAUSTED without the field; "%g" would print 1.0000000000000002 as 1.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvtrim {

/// The longest prefix of a client string a message quotes (a model digest, 71 bytes, is
/// quoted whole).
inline constexpr size_t kQuotedPrefixBytes = 96;

/// `text` quoted for a message: 'text' with control and non-ASCII bytes C-escaped; when
/// longer than `limit` bytes, its first `limit` bytes then "...' (N bytes)".
std::string QuoteClientText(std::string_view text, size_t limit = kQuotedPrefixBytes);

/// `text` for use inside a field path (e.g. params.<name>): the text itself when short and
/// printable, else its escaped prefix plus "...(N bytes)".
std::string ClientTextInField(std::string_view text, size_t limit = kQuotedPrefixBytes);

/// `value` printed exactly: the shortest decimal text that reads back as the same double
/// (1.0000000000000002, 1048576, 1e+300, nan, inf).
std::string ExactNumber(double value);

}  // namespace kvtrim
