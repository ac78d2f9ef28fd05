#include "kernels/client_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtrim {

namespace {

/// The first `limit` bytes of `text`, C-escaped, and whether it was cut.
std::string EscapedPrefix(std::string_view text, size_t limit, bool* cut) {
  *cut = text.size() > limit;
  // Debian's Abseil has its own string_view type.
  return absl::CHexEscape(absl::string_view(text.data(), std::min(text.size(), limit)));
}

}  // namespace

std::string QuoteClientText(std::string_view text, size_t limit) {
  bool cut = false;
  std::string prefix = EscapedPrefix(text, limit, &cut);
  if (!cut) return absl::StrCat("'", prefix, "'");
  return absl::StrCat("'", prefix, "...' (", text.size(), " bytes)");
}

std::string ClientTextInField(std::string_view text, size_t limit) {
  bool cut = false;
  std::string prefix = EscapedPrefix(text, limit, &cut);
  if (!cut) return prefix;
  return absl::StrCat(prefix, "...(", text.size(), " bytes)");
}

std::string ExactNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

}  // namespace kvtrim
