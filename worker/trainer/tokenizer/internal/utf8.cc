#include "worker/trainer/tokenizer/internal/utf8.h"

namespace trainctl::tokenizer::internal {
namespace {

// Length of the well-formed sequence at text[i] (> 0), or minus the length of its maximal
// ill-formed subpart (< 0).
int SequenceLength(absl::string_view text, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + i;
  const size_t avail = text.size() - i;
  const unsigned char b = p[0];
  if (b < 0x80) return 1;
  int trail;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the first trailing byte
  if (b >= 0xC2 && b <= 0xDF) {
    trail = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    trail = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    trail = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= trail; ++k) {
    if (static_cast<size_t>(k) >= avail) return -k;
    const unsigned char c = p[k];
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return -k;
  }
  return trail + 1;
}

}  // namespace

size_t FindInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const int len = SequenceLength(text, i);
    if (len < 0) return i;
    i += len;
  }
  return kValidUtf8;
}

std::string ToValidUtf8(absl::string_view bytes) {
  const size_t first_bad = FindInvalidUtf8(bytes);
  if (first_bad == kValidUtf8) return std::string(bytes);
  std::string out(bytes.substr(0, first_bad));
  size_t i = first_bad;
  while (i < bytes.size()) {
    const int len = SequenceLength(bytes, i);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += -len;
    }
  }
  return out;
}

char32_t DecodeUtf8(absl::string_view text, size_t i, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + i;
  if (p[0] < 0x80) {
    *len = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *len = 2;
    return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if (p[0] < 0xF0) {
    *len = 3;
    return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  }
  *len = 4;
  return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

char32_t DecodeUtf8Before(absl::string_view text, size_t end, int* len) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return DecodeUtf8(text, start, len);
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsWhiteSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace trainctl::tokenizer::internal
