// Reads the parts of an HF tokenizer.json that a byte-level BPE tokenizer consists of, and refuses
// (naming the field) any setting it would not honour, so a loaded tokenizer never silently differs
// from HF's.
#ifndef TRAINCTL_COMMON_TOKENIZER_INTERNAL_TOKENIZER_JSON_H_
#define TRAINCTL_COMMON_TOKENIZER_INTERNAL_TOKENIZER_JSON_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/internal/added_tokens.h"
#include "common/tokenizer/internal/bpe_model.h"

namespace trainctl::tokenizer::internal {

struct TokenizerSpec {
  bool nfc = false;           // normalizer: NFC (or a Sequence of it); false for none
  std::string split_pattern;  // the pre-tokenizer's regex, Oniguruma syntax
  BpeModelSpec model;
  std::vector<AddedToken> added_tokens;
};

// INVALID_ARGUMENT when `json_text` is not JSON, lacks a required field, has one of the wrong
// type, or asks for something unsupported (a normalizer other than NFC, a non-BPE model, BPE
// dropout, subword prefixes, byte fallback, a pre-tokenizer other than Split+ByteLevel or
// ByteLevel, a decoder other than ByteLevel). Messages name the JSON path; callers add the file.
// The post_processor is not read: Encode never adds special tokens of its own.
absl::StatusOr<TokenizerSpec> ParseTokenizerJson(absl::string_view json_text);

}  // namespace trainctl::tokenizer::internal

#endif  // TRAINCTL_COMMON_TOKENIZER_INTERNAL_TOKENIZER_JSON_H_
