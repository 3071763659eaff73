#include "common/utf8.h"

namespace trainctl {
namespace {

// The well-formed UTF-8 sequence starting at s[pos] (Unicode table 3-7): returns its length, or,
// when it is ill-formed, minus the length of its maximal subpart (at least 1).
int SequenceAt(absl::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // no overlong forms
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // a continuation byte, C0, C1 or F5..FF
  }
  for (int i = 1; i < length; ++i) {
    if (pos + i >= s.size()) return -i;
    const unsigned char c = byte(pos + i);
    if (c < (i == 1 ? low : 0x80) || c > (i == 1 ? high : 0xBF)) return -i;
  }
  return length;
}

}  // namespace

size_t FindInvalidUtf8(absl::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const int n = SequenceAt(s, pos);
    if (n < 0) return pos;
    pos += n;
  }
  return kValidUtf8;
}

std::string ToValidUtf8(absl::string_view s) {
  const size_t first_bad = FindInvalidUtf8(s);
  if (first_bad == kValidUtf8) return std::string(s);
  std::string out(s.substr(0, first_bad));
  out.reserve(s.size() + 16);
  for (size_t pos = first_bad; pos < s.size();) {
    const int n = SequenceAt(s, pos);
    if (n > 0) {
      out.append(s.data() + pos, n);
      pos += n;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      pos += -n;
    }
  }
  return out;
}

size_t Utf8PrefixLength(absl::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  // The start of the character that holds byte `max_bytes`: at most 3 continuation bytes back.
  size_t start = max_bytes;
  while (start > 0 && max_bytes - start < 3 &&
         (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  if (start > 0 && start < max_bytes) {
    const int n = SequenceAt(s, start);
    if (n > 0 && start + n > max_bytes) return start;
  }
  return max_bytes;
}

}  // namespace trainctl
