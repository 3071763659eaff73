// Added tokens (special tokens such as <|im_start|> and other whole-string tokens) are found in the
// text before anything else happens to it, so that no normalizer or regex ever splits them.
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_ADDED_TOKENS_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_ADDED_TOKENS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace trainctl::tokenizer::internal {

// One entry of tokenizer.json's "added_tokens", with HF's meaning of each flag.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // dropped by Decode when asked to skip special tokens
  bool single_word = false;  // matches only where no word character touches it on either side
  bool lstrip = false;       // swallows the whitespace to its left
  bool rstrip = false;       // swallows the whitespace to its right
  bool normalized = false;   // matched in the normalized text rather than the raw text
};

// A piece of text: either plain text still to be tokenized (token_id == kPlainText) or one added
// token (with whatever whitespace its lstrip/rstrip swallowed).
struct TextPiece {
  static constexpr int32_t kPlainText = -1;
  size_t begin = 0;
  size_t end = 0;
  int32_t token_id = kPlainText;
};

// Immutable after construction; thread-safe.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  // Appends the pieces of `text` (valid UTF-8), in order, covering it exactly; plain pieces are
  // never empty. Matching is leftmost-longest over all tokens, as HF's AddedVocabulary does.
  void Split(absl::string_view text, std::vector<TextPiece>* pieces) const;

 private:
  // The longest token matching at text[pos], or nullptr.
  const AddedToken* LongestAt(absl::string_view text, size_t pos) const;
  bool SingleWordOk(absl::string_view text, size_t begin, size_t end) const;

  std::vector<AddedToken> tokens_;
  std::array<std::vector<int>, 256> by_first_byte_;  // indices into tokens_, longest first
};

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_ADDED_TOKENS_H_
