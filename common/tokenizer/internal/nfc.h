// Unicode NFC normalization (ICU), the only normalizer Qwen's tokenizer.json asks for.
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_NFC_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_NFC_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl::tokenizer::internal {

// INTERNAL when ICU's NFC data cannot be loaded (a broken ICU installation). Call once before
// NfcIfChanged; thread-safe.
absl::Status CheckNfcAvailable();

// NFC(text), or nullopt when `text` is already in NFC (the common case, answered without copying).
// `text` must be valid UTF-8. Thread-safe.
std::optional<std::string> NfcIfChanged(absl::string_view text);

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_NFC_H_
