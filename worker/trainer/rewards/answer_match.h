// Deciding whether a model's final answer equals a reference answer, the way a grader of
// multimodal math/choice questions would: the same number however it is written, the same
// multiple-choice letter however it is marked, else the same text up to case, spacing and
// trailing punctuation. A small, deterministic stand-in for open-r1-multimodal's math_verify +
// string match; no symbolic algebra (x+1 and 1+x differ).
//
// Pure functions on UTF-8 text (only ASCII is case-folded); thread-safe.
#ifndef TRAINCTL_WORKER_TRAINER_REWARDS_ANSWER_MATCH_H_
#define TRAINCTL_WORKER_TRAINER_REWARDS_ANSWER_MATCH_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace trainctl::rewards {

// The text between the first "<answer>" and the first "</answer>" after it (newlines included),
// or nullopt when there is no such pair.
std::optional<absl::string_view> ExtractAnswer(absl::string_view text);

// The answer with its LaTeX dressing removed: the contents of the last \boxed{...} (or \fbox)
// when there is one; $...$, \(...\), \[...\] delimiters; \text{}/\mathrm{}/\textbf{} wrappers
// (their contents kept); \left, \right, \! \, \; \: and "\ " spacing; the Unicode minus as '-'.
// Trimmed.
std::string StripLatex(absl::string_view answer);

// The choice letter A-Z of a multiple-choice answer written "B", "(B)", "B.", "B)", "B:",
// "(B) 30°", "B. 30°", "Option B", "choice (b)", "Answer: B"; nullopt for anything else ("B
// and C", "Because"). Bare letters must be upper case; after a keyword or in parentheses either
// case is read. Expects StripLatex's output.
std::optional<char> ChoiceLetter(absl::string_view answer);

// A number written as an integer or decimal ("-3", "0.5", ".5"), with thousands separators
// ("1,234,567"), as a fraction ("3/4", "\frac{3}{4}", "\dfrac34" is not), with a leading
// currency sign ("$5"), a trailing percent ("50%" reads 50, see NumbersMatch), a degree sign
// ("45°", "45^\circ"), or trailing unit words ("5 cm", "12 apples"); "x = 5" reads the right-hand
// side. nullopt when anything else follows or precedes the number ("5 + 3", "about 5", "2x").
// Expects StripLatex's output.
struct ParsedNumber {
  double value = 0;
  bool percent = false;
};
std::optional<ParsedNumber> ParseNumber(absl::string_view answer);

// Equal within a relative tolerance of 1e-6 (math_verify rounds to 6 digits); a percentage also
// equals its fraction ("50%" == "0.5") when only one side is written as a percentage.
bool NumbersMatch(const ParsedNumber& a, const ParsedNumber& b);

// Lower-cased ASCII, runs of whitespace as one space, trimmed, trailing . , ; : ! ? removed,
// surrounding quotes removed.
std::string NormalizeText(absl::string_view answer);

// True when `answer` and `reference` say the same thing: choice letters when both are choices,
// numbers when both are numbers, else normalised text, all after StripLatex.
bool AnswersMatch(absl::string_view answer, absl::string_view reference);

}  // namespace trainctl::rewards

#endif  // TRAINCTL_WORKER_TRAINER_REWARDS_ANSWER_MATCH_H_
