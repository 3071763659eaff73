// UTF-8 primitives the tokenizer needs: validation, lossy repair, code point access and the
// Unicode White_Space set. Pure functions, thread-safe.
#ifndef TRAINCTL_WORKER_TRAINER_TOKENIZER_INTERNAL_UTF8_H_
#define TRAINCTL_WORKER_TRAINER_TOKENIZER_INTERNAL_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::tokenizer::internal {

inline constexpr size_t kValidUtf8 = static_cast<size_t>(-1);

// Byte offset of the first ill-formed sequence in `text`, or kValidUtf8 when it is all well-formed
// (Unicode Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF).
size_t FindInvalidUtf8(absl::string_view text);

// `bytes` with each maximal ill-formed subpart replaced by U+FFFD, the practice that Rust's
// from_utf8_lossy and the WHATWG TextDecoder follow, so decoded text matches theirs.
std::string ToValidUtf8(absl::string_view bytes);

// The code point starting at text[i]; `text` must be valid UTF-8. Sets *len to its byte count.
char32_t DecodeUtf8(absl::string_view text, size_t i, int* len);

// The code point ending just before text[end] (end > 0); `text` must be valid UTF-8.
char32_t DecodeUtf8Before(absl::string_view text, size_t end, int* len);

void AppendUtf8(char32_t c, std::string* out);

// Unicode's White_Space property (what Oniguruma's and Rust's \s match).
bool IsWhiteSpace(char32_t c);

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_WORKER_TRAINER_TOKENIZER_INTERNAL_UTF8_H_
