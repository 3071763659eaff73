// GPT-2's byte-level alphabet, which byte-level BPE vocabularies (Qwen's among them) are written
// in: each of the 256 byte values stands for one printable code point, so any byte string is a
// string of vocabulary symbols. Printable Latin-1 bytes stand for themselves; the other 68 map, in
// byte order, to U+0100.. (space 0x20 is 'Ġ' U+0120, newline 0x0A is 'Ċ' U+010A). Thread-safe.
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_BYTE_LEVEL_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_BYTE_LEVEL_H_

#include <array>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::tokenizer::internal {

// The UTF-8 encoding of the symbol for each byte value.
const std::array<std::string, 256>& ByteSymbols();

// Appends to *bytes the bytes that the symbols of `token` stand for and returns true; returns
// false, leaving *bytes as it was, when some code point of `token` is not a symbol. `token` must
// be valid UTF-8 (every string parsed from JSON is).
bool AppendSymbolBytes(absl::string_view token, std::string* bytes);

// Number of symbols (= bytes it stands for) in `token`, or -1 if it is not all symbols.
int SymbolCount(absl::string_view token);

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_BYTE_LEVEL_H_
