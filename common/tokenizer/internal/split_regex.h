// The pre-tokenizer's split: a regex from tokenizer.json (written for Oniguruma, which HF's Rust
// tokenizers use) compiled with PCRE2 in UTF + UCP mode and JIT, applied with the "Isolated"
// behaviour (every match and every gap between matches is a piece of its own).
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_SPLIT_REGEX_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_SPLIT_REGEX_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::tokenizer::internal {

// The pattern of GPT-2's ByteLevel pre-tokenizer (used when tokenizer.json says use_regex: true).
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rewrites the parts of an Oniguruma pattern whose meaning differs in PCRE2: \s and \S become
// explicit Unicode White_Space classes (PCRE2's \s lacks U+0085). Exposed for tests.
std::string TranslateOnigurumaPattern(absl::string_view pattern);

// Immutable after Compile; Split is thread-safe.
class SplitRegex {
 public:
  // INVALID_ARGUMENT with PCRE2's message and offset when `pattern` does not compile.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(absl::string_view pattern);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Appends the [begin, end) byte ranges of the pieces of `text` (valid UTF-8), in order; they
  // cover `text` exactly and none is empty. INTERNAL if PCRE2 fails (e.g. its match limit).
  absl::Status Split(absl::string_view text, std::vector<std::pair<size_t, size_t>>* pieces) const;

 private:
  struct Code;
  explicit SplitRegex(std::unique_ptr<Code> code);

  std::unique_ptr<Code> code_;
};

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_SPLIT_REGEX_H_
