// UTF-8 primitives the tokenizer needs beyond common/utf8.h (validation, lossy repair): code point
// access and the Unicode White_Space set. Pure functions, thread-safe.
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_UTF8_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::tokenizer::internal {

// The code point starting at text[i]; `text` must be valid UTF-8. Sets *len to its byte count.
char32_t DecodeUtf8(absl::string_view text, size_t i, int* len);

// The code point ending just before text[end] (end > 0); `text` must be valid UTF-8.
char32_t DecodeUtf8Before(absl::string_view text, size_t end, int* len);

void AppendUtf8(char32_t c, std::string* out);

// Unicode's White_Space property (what Oniguruma's and Rust's \s match).
bool IsWhiteSpace(char32_t c);

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_UTF8_H_
