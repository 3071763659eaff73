// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json — Qwen's (151,643 BPE tokens
// plus <|im_start|>, <|image_pad|>, ...) and others of its kind — giving the ids HF's tokenizers
// give. Encoding runs: added tokens are cut out of the raw text (leftmost-longest), the rest is
// NFC-normalized when the file asks for it, split by the pre-tokenizer's regex (PCRE2, JIT), each
// piece mapped to byte-level symbols and merged by BPE rank.
//
// Thread-safe: every method is const and may be called from several threads at once.
#ifndef TRAINCTL_COMMON_TOKENIZER_BPE_TOKENIZER_H_
#define TRAINCTL_COMMON_TOKENIZER_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trainctl::tokenizer {

namespace internal {
struct AddedToken;
class AddedTokenMatcher;
class BpeModel;
class SplitRegex;
struct TokenizerSpec;
}  // namespace internal

// Ids with the byte range [first, second) of the input that each one came from. A token of text
// that normalization changed spans the whole run of text between added tokens that held it.
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, size_t>> spans;
};

class BpeTokenizer {
 public:
  // Loads `path`, a tokenizer.json or a directory holding one. NOT_FOUND when the file cannot be
  // read; INVALID_ARGUMENT, naming the file and the JSON field, when it is malformed or asks for
  // something this tokenizer does not implement; INTERNAL when ICU's NFC data is missing.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Load(const std::string& path);

  // As Load, from the file's text; `source` names it in error messages.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(absl::string_view json,
                                                                absl::string_view source);

  ~BpeTokenizer();
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // The ids of `text`, with no special tokens added around it. INVALID_ARGUMENT (with the byte
  // offset) when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // As Encode, with the span of each id.
  absl::StatusOr<Encoding> EncodeWithSpans(absl::string_view text) const;

  // The text of `ids`: added tokens verbatim (special ones left out when `skip_special_tokens`),
  // runs of BPE tokens as the UTF-8 their bytes form, an ill-formed part as U+FFFD.
  // INVALID_ARGUMENT naming the first id that is not in the vocabulary, unless
  // `drop_unknown_ids`: then such ids are left out, as HF tokenizers' decode does. Text a model
  // generated is decoded so: its embedding has more rows than the tokenizer has tokens (151,936
  // against 151,669 for Qwen2-VL), and sampling can pick one of the extra rows.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false,
                                     bool drop_unknown_ids = false) const;

  // The id of an added token or vocabulary entry (byte-level symbols, e.g. "Ġthe"), if any.
  std::optional<int32_t> TokenToId(absl::string_view token) const;

  // The normalizer applied to `text` (NFC, or nothing); `text` must be valid UTF-8, else it is
  // returned unchanged.
  std::string Normalize(absl::string_view text) const;

  // One past the highest id (vocabulary and added tokens); 151,669 for Qwen's tokenizer.
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

  // The most bytes of (normalized) text one id stands for: an added token's content or a BPE
  // token's bytes. Text of B bytes after normalization is at least B / max_token_bytes() ids.
  int64_t max_token_bytes() const { return max_token_bytes_; }

 private:
  struct TokenInfo {
    std::string text;         // byte-level symbols for BPE tokens, the content for added tokens
    int32_t byte_length = 0;  // bytes of input it stands for (BPE tokens)
    bool present = false;
    bool added = false;
    bool special = false;
  };

  // Where the ids of a piece of text came from: `offset` + their position in it, or, when the
  // piece is normalized text, the whole `coarse` span of the input it was made from.
  struct Origin {
    size_t offset = 0;
    std::optional<std::pair<size_t, size_t>> coarse;
  };

  BpeTokenizer();
  absl::Status Init(internal::TokenizerSpec spec);
  void InitAddedTokens(std::vector<internal::AddedToken> tokens);
  // Encodes text between raw added tokens: normalizes it, then splits at normalized added tokens.
  absl::Status EncodeRun(absl::string_view run, size_t offset, Encoding* out) const;
  // Encodes text between added tokens: regex split, then BPE.
  absl::Status EncodePlain(absl::string_view text, const Origin& origin, Encoding* out) const;

  std::unique_ptr<internal::BpeModel> model_;
  std::unique_ptr<internal::SplitRegex> split_;
  std::unique_ptr<internal::AddedTokenMatcher> raw_added_;         // matched before normalizing
  std::unique_ptr<internal::AddedTokenMatcher> normalized_added_;  // matched after
  bool nfc_ = false;
  int64_t max_token_bytes_ = 1;
  std::vector<TokenInfo> tokens_;                        // by id
  absl::flat_hash_map<std::string, int32_t> added_ids_;  // by content
};

}  // namespace trainctl::tokenizer

#endif  // TRAINCTL_COMMON_TOKENIZER_BPE_TOKENIZER_H_
