#include "worker/trainer/rewards/answer_match.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace trainctl::rewards {
namespace {

constexpr absl::string_view kDegree = "\xC2\xB0";            // °
constexpr absl::string_view kUnicodeMinus = "\xE2\x88\x92";  // −

absl::string_view Trim(absl::string_view s) { return absl::StripAsciiWhitespace(s); }

// The index just past the '}' matching the '{' at `open`, or npos when it is not closed.
size_t MatchBrace(absl::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i + 1;
  }
  return absl::string_view::npos;
}

// `s` at `pos` starts with the command `name` (e.g. "\\text") not followed by another letter.
bool CommandAt(absl::string_view s, size_t pos, absl::string_view name) {
  if (s.substr(pos, name.size()) != name) return false;
  const size_t end = pos + name.size();
  return end >= s.size() || !absl::ascii_isalpha(static_cast<unsigned char>(s[end]));
}

// The contents of the last \boxed{...} or \fbox{...}; `s` itself when it has none.
absl::string_view UnwrapBoxed(absl::string_view s) {
  size_t best = absl::string_view::npos;
  size_t name_len = 0;
  for (absl::string_view name : {absl::string_view("\\boxed"), absl::string_view("\\fbox")}) {
    const size_t at = s.rfind(name);
    if (at != absl::string_view::npos && (best == absl::string_view::npos || at > best)) {
      best = at;
      name_len = name.size();
    }
  }
  if (best == absl::string_view::npos) return s;
  size_t open = best + name_len;
  while (open < s.size() && s[open] == ' ') ++open;
  if (open >= s.size() || s[open] != '{') return s;
  const size_t close = MatchBrace(s, open);
  if (close == absl::string_view::npos) return s.substr(open + 1);  // cut off: keep what is there
  return s.substr(open + 1, close - open - 2);
}

// Drops one pair of math delimiters around the whole of `s`; false when there is none.
bool StripDelimiters(absl::string_view& s) {
  for (auto [open, close] : {std::pair<absl::string_view, absl::string_view>{"$$", "$$"},
                             {"\\(", "\\)"},
                             {"\\[", "\\]"},
                             {"$", "$"}}) {
    if (s.size() >= open.size() + close.size() && absl::StartsWith(s, open) &&
        absl::EndsWith(s, close)) {
      s = Trim(s.substr(open.size(), s.size() - open.size() - close.size()));
      return true;
    }
  }
  return false;
}

// Replaces every \name{X} by X.
void UnwrapCommand(std::string& s, absl::string_view name) {
  size_t at = 0;
  while ((at = s.find(name.data(), at, name.size())) != std::string::npos) {
    size_t open = at + name.size();
    if (open >= s.size() || s[open] != '{') {
      at = open;
      continue;
    }
    const size_t close = MatchBrace(s, open);
    if (close != std::string::npos) s.erase(close - 1, 1);
    s.erase(at, open + 1 - at);
  }
}

// Removes every occurrence of the command `name` (not a prefix of a longer command).
void DropCommand(std::string& s, absl::string_view name) {
  size_t at = 0;
  while ((at = s.find(name.data(), at, name.size())) != std::string::npos) {
    if (CommandAt(s, at, name)) {
      s.erase(at, name.size());
    } else {
      at += name.size();
    }
  }
}

// A plain decimal at the start of `s` ("12", "1,234.5", ".5"; no sign), advancing `s` past it.
std::optional<double> ConsumeDecimal(absl::string_view& s) {
  size_t i = 0;
  std::string digits;
  while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) digits += s[i++];
  // Thousands separators: a first group of 1-3 digits, then ",ddd" groups.
  if (!digits.empty() && digits.size() <= 3) {
    while (i + 3 < s.size() && s[i] == ',' && absl::ascii_isdigit(s[i + 1]) &&
           absl::ascii_isdigit(s[i + 2]) && absl::ascii_isdigit(s[i + 3]) &&
           (i + 4 >= s.size() || !absl::ascii_isdigit(static_cast<unsigned char>(s[i + 4])))) {
      digits.append(s.data() + i + 1, 3);
      i += 4;
    }
  }
  if (i < s.size() && s[i] == '.' && i + 1 < s.size() && absl::ascii_isdigit(s[i + 1])) {
    digits += s[i++];
    while (i < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[i]))) digits += s[i++];
  }
  double value;
  if (digits.empty() || !absl::SimpleAtod(digits, &value)) return std::nullopt;
  s.remove_prefix(i);
  return value;
}

// A signed plain decimal that is all of `s`.
std::optional<double> WholeDecimal(absl::string_view s) {
  s = Trim(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s = Trim(s.substr(1));
  }
  std::optional<double> v = ConsumeDecimal(s);
  if (!v || !Trim(s).empty()) return std::nullopt;
  return negative ? -*v : *v;
}

// \frac{a}{b} at the start of `s`, advancing past it.
std::optional<double> ConsumeLatexFraction(absl::string_view& s) {
  if (!absl::ConsumePrefix(&s, "\\frac")) return std::nullopt;
  double parts[2];
  for (double& part : parts) {
    s = absl::StripLeadingAsciiWhitespace(s);
    if (s.empty() || s[0] != '{') return std::nullopt;
    const size_t close = MatchBrace(s, 0);
    if (close == absl::string_view::npos) return std::nullopt;
    std::optional<double> v = WholeDecimal(s.substr(1, close - 2));
    if (!v) return std::nullopt;
    part = *v;
    s.remove_prefix(close);
  }
  if (parts[1] == 0) return std::nullopt;
  return parts[0] / parts[1];
}

// Unit words: letters (including non-ASCII ones such as "cm²" or "度"), spaces and dots; no
// digits, no operators.
bool IsUnitWords(absl::string_view s) {
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80 && !absl::ascii_isalpha(c) && !absl::ascii_isspace(c) && c != '.') return false;
  }
  return true;
}

// What may follow a number: nothing, or unit words after a space ("5 cm") or starting with a
// non-ASCII letter ("5厘米"); "2x" is not a number.
bool IsUnitTail(absl::string_view s) {
  if (s.empty()) return true;
  const auto first = static_cast<unsigned char>(s[0]);
  return (absl::ascii_isspace(first) || first >= 0x80) && IsUnitWords(s);
}

bool Close(double a, double b) {
  return std::fabs(a - b) <= 1e-6 * std::max({1.0, std::fabs(a), std::fabs(b)});
}

}  // namespace

std::optional<absl::string_view> ExtractAnswer(absl::string_view text) {
  constexpr absl::string_view kOpen = "<answer>", kClose = "</answer>";
  const size_t open = text.find(kOpen);
  if (open == absl::string_view::npos) return std::nullopt;
  const size_t begin = open + kOpen.size();
  const size_t close = text.find(kClose, begin);
  if (close == absl::string_view::npos) return std::nullopt;
  return text.substr(begin, close - begin);
}

std::string StripLatex(absl::string_view answer) {
  absl::string_view s = Trim(UnwrapBoxed(Trim(answer)));
  while (StripDelimiters(s)) {
  }
  std::string out(s);
  for (absl::string_view wrapper : {"\\text", "\\mathrm", "\\textbf", "\\mathbf", "\\textit"}) {
    UnwrapCommand(out, wrapper);
  }
  DropCommand(out, "\\left");
  DropCommand(out, "\\right");
  absl::StrReplaceAll({{"\\dfrac", "\\frac"},
                       {"\\tfrac", "\\frac"},
                       {"^{\\circ}", kDegree},
                       {"^\\circ", kDegree},
                       {"\\circ", kDegree},
                       {"\\degree", kDegree},
                       {"\\%", "%"},
                       {"\\$", "$"},
                       {"\\!", ""},
                       {"\\,", " "},
                       {"\\;", " "},
                       {"\\:", " "},
                       {"\\ ", " "},
                       {kUnicodeMinus, "-"}},
                      &out);
  return std::string(Trim(out));
}

std::optional<char> ChoiceLetter(absl::string_view answer) {
  absl::string_view s = Trim(answer);
  bool keyword = false;
  for (absl::string_view word : {"the answer is", "answer", "option", "choice"}) {
    if (s.size() > word.size() && absl::StartsWithIgnoreCase(s, word) &&
        !absl::ascii_isalpha(static_cast<unsigned char>(s[word.size()]))) {
      s = Trim(s.substr(word.size()));
      absl::ConsumePrefix(&s, ":");
      s = Trim(s);
      keyword = true;
      break;
    }
  }
  if (s.size() >= 3 && s[0] == '(' && absl::ascii_isalpha(static_cast<unsigned char>(s[1])) &&
      s[2] == ')') {
    return absl::ascii_toupper(static_cast<unsigned char>(s[1]));
  }
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) return std::nullopt;
  if (!keyword && !absl::ascii_isupper(static_cast<unsigned char>(s[0]))) return std::nullopt;
  if (s.size() == 1 || std::strchr(".):", s[1]) != nullptr) {
    return absl::ascii_toupper(static_cast<unsigned char>(s[0]));
  }
  return std::nullopt;
}

std::optional<ParsedNumber> ParseNumber(absl::string_view answer) {
  absl::string_view s = Trim(answer);
  while (!s.empty() && std::strchr(".,;!?", s.back()) != nullptr)
    s = Trim(s.substr(0, s.size() - 1));
  if (const size_t eq = s.rfind('='); eq != absl::string_view::npos) s = Trim(s.substr(eq + 1));
  bool negative = false;
  for (int round = 0; round < 2; ++round) {  // "-$5" and "$-5"
    if (absl::ConsumePrefix(&s, "-")) {
      negative = !negative;
    } else {
      absl::ConsumePrefix(&s, "+");
    }
    if (absl::ConsumePrefix(&s, "$")) s = absl::StripLeadingAsciiWhitespace(s);
  }
  std::optional<double> value = ConsumeLatexFraction(s);
  if (!value) {
    value = ConsumeDecimal(s);
    if (!value) return std::nullopt;
    if (absl::ConsumePrefix(&s, "/")) {
      std::optional<double> den = ConsumeDecimal(s);
      if (!den || *den == 0) return std::nullopt;
      *value /= *den;
    }
  }
  ParsedNumber out{negative ? -*value : *value, false};
  absl::string_view tail = absl::StripLeadingAsciiWhitespace(s);
  if (absl::ConsumePrefix(&tail, "%")) {
    out.percent = true;
    return IsUnitWords(tail) ? std::optional<ParsedNumber>(out) : std::nullopt;
  }
  if (absl::ConsumePrefix(&tail, kDegree)) {
    return IsUnitWords(tail) ? std::optional<ParsedNumber>(out) : std::nullopt;
  }
  return IsUnitTail(s) ? std::optional<ParsedNumber>(out) : std::nullopt;
}

bool NumbersMatch(const ParsedNumber& a, const ParsedNumber& b) {
  if (Close(a.value, b.value)) return true;
  if (a.percent && !b.percent) return Close(a.value / 100, b.value);
  if (b.percent && !a.percent) return Close(a.value, b.value / 100);
  return false;
}

std::string NormalizeText(absl::string_view answer) {
  std::string out;
  for (char ch : answer) {
    const auto c = static_cast<unsigned char>(ch);
    if (absl::ascii_isspace(c)) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += static_cast<char>(absl::ascii_tolower(c));
    }
  }
  for (;;) {
    const size_t before = out.size();
    while (!out.empty() && (out.back() == ' ' || std::strchr(".,;:!?", out.back()) != nullptr)) {
      out.pop_back();
    }
    if (out.size() >= 2 && (out[0] == '"' || out[0] == '\'') && out.back() == out[0]) {
      out = out.substr(1, out.size() - 2);
    }
    while (!out.empty() && out[0] == ' ') out.erase(0, 1);
    if (out.size() == before) return out;
  }
}

bool AnswersMatch(absl::string_view answer, absl::string_view reference) {
  const std::string a = StripLatex(answer);
  const std::string r = StripLatex(reference);
  if (r.empty()) return false;  // nothing to judge against
  const std::optional<char> ca = ChoiceLetter(a), cr = ChoiceLetter(r);
  if (ca && cr) return *ca == *cr;
  const std::optional<ParsedNumber> na = ParseNumber(a), nr = ParseNumber(r);
  if (na && nr) return NumbersMatch(*na, *nr);
  return NormalizeText(a) == NormalizeText(r);
}

}  // namespace trainctl::rewards
