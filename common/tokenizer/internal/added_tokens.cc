#include "common/tokenizer/internal/added_tokens.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "common/tokenizer/internal/utf8.h"

namespace trainctl::tokenizer::internal {
namespace {

// What \w matches in Rust's regex crate (HF decides single_word with it): alphabetic, marks,
// decimal digits, connector punctuation and the join controls.
bool IsWordChar(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int8_t type = u_charType(u);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

size_t SkipWhiteSpaceLeft(absl::string_view text, size_t pos, size_t floor) {
  while (pos > floor) {
    int len = 0;
    if (!IsWhiteSpace(DecodeUtf8Before(text, pos, &len))) break;
    pos -= len;
  }
  return pos;
}

size_t SkipWhiteSpaceRight(absl::string_view text, size_t pos) {
  while (pos < text.size()) {
    int len = 0;
    if (!IsWhiteSpace(DecodeUtf8(text, pos, &len))) break;
    pos += len;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  tokens_.erase(std::remove_if(tokens_.begin(), tokens_.end(),
                               [](const AddedToken& t) { return t.content.empty(); }),
                tokens_.end());
  for (int i = 0; i < static_cast<int>(tokens_.size()); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& candidates : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [this](int a, int b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedToken* AddedTokenMatcher::LongestAt(absl::string_view text, size_t pos) const {
  const absl::string_view rest = text.substr(pos);
  for (const int index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    if (absl::StartsWith(rest, tokens_[index].content)) return &tokens_[index];
  }
  return nullptr;
}

bool AddedTokenMatcher::SingleWordOk(absl::string_view text, size_t begin, size_t end) const {
  int len = 0;
  if (begin > 0 && IsWordChar(DecodeUtf8Before(text, begin, &len))) return false;
  return end >= text.size() || !IsWordChar(DecodeUtf8(text, end, &len));
}

void AddedTokenMatcher::Split(absl::string_view text, std::vector<TextPiece>* pieces) const {
  size_t plain_begin = 0;  // end of the previous added token
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* token = empty() ? nullptr : LongestAt(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + token->content.size();
    pos = end;  // a discarded match is consumed too, as in HF's non-overlapping search
    if (token->single_word && !SingleWordOk(text, begin, end)) continue;
    if (token->lstrip) begin = SkipWhiteSpaceLeft(text, begin, plain_begin);
    if (token->rstrip) end = pos = SkipWhiteSpaceRight(text, end);
    if (begin > plain_begin) pieces->push_back({plain_begin, begin, TextPiece::kPlainText});
    pieces->push_back({begin, end, token->id});
    plain_begin = end;
  }
  if (plain_begin < text.size())
    pieces->push_back({plain_begin, text.size(), TextPiece::kPlainText});
}

}  // namespace trainctl::tokenizer::internal
