#include "common/tokenizer/internal/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/internal/utf8.h"

namespace trainctl::tokenizer::internal {
namespace {

// Unicode White_Space, as the body of a character class.
constexpr char kWhiteSpaceClassBody[] =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string TranslateOnigurumaPattern(absl::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", kWhiteSpaceClassBody, in_class ? "" : "]");
      } else if (next == 'S' && !in_class) {
        absl::StrAppend(&out, "[^", kWhiteSpaceClassBody, "]");
      } else {
        out.push_back(c);
        out.push_back(next);
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(std::unique_ptr<Code> code) : code_(std::move(code)) {}
SplitRegex::~SplitRegex() = default;

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(absl::string_view pattern) {
  const std::string translated = TranslateOnigurumaPattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code->code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("split regex does not compile (",
                                                   Pcre2Error(error), " at offset ", offset,
                                                   " of '", translated, "')"));
  }
  // Without JIT (a platform PCRE2 lacks it for) matching still works, only slower.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<SplitRegex>(new SplitRegex(std::move(code)));
}

absl::Status SplitRegex::Split(absl::string_view text,
                               std::vector<std::pair<size_t, size_t>>* pieces) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                               match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return absl::InternalError(absl::StrCat("split regex: ", Pcre2Error(rc)));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {  // an empty match splits nothing; step over one code point
      if (begin >= text.size()) break;
      int len = 0;
      DecodeUtf8(text, begin, &len);
      pos = begin + len;
      continue;
    }
    if (begin > gap_begin) pieces->emplace_back(gap_begin, begin);
    pieces->emplace_back(begin, end);
    gap_begin = pos = end;
  }
  if (gap_begin < text.size()) pieces->emplace_back(gap_begin, text.size());
  return absl::OkStatus();
}

}  // namespace trainctl::tokenizer::internal
