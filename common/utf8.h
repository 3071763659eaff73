// UTF-8 at the edges. Protobuf `string` fields must hold well-formed UTF-8 (a peer refuses to
// parse a message otherwise), so bytes from outside the process — rank output, event lines — are
// made well-formed before they go into one, and cut only between characters.
#ifndef TRAINCTL_COMMON_UTF8_H_
#define TRAINCTL_COMMON_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl {

inline constexpr size_t kValidUtf8 = static_cast<size_t>(-1);

// Byte offset of the first ill-formed sequence in `s`, or kValidUtf8 when it is all well-formed
// (RFC 3629, Unicode table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF).
size_t FindInvalidUtf8(absl::string_view s);

// True when `s` is well-formed UTF-8.
inline bool IsValidUtf8(absl::string_view s) { return FindInvalidUtf8(s) == kValidUtf8; }

// `s` with each maximal ill-formed subsequence replaced by U+FFFD (the Unicode standard's
// "substitution of maximal subparts", as WHATWG decoders and Python's errors="replace" do), so
// "caf\xe9" becomes "caf\uFFFD". Well-formed input is returned unchanged.
std::string ToValidUtf8(absl::string_view s);

// The length of the longest prefix of `s` of at most `max_bytes` bytes that does not end inside a
// well-formed multi-byte character: where to cut `s` so that both pieces stay well-formed if `s`
// was. Returns `s.size()` when it fits, and `max_bytes` when no character boundary lies in the last
// 3 bytes before it (ill-formed input, or max_bytes < 4 at the start of a character), so a caller
// cutting in a loop always makes progress for max_bytes >= 1.
size_t Utf8PrefixLength(absl::string_view s, size_t max_bytes);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_UTF8_H_
