#include "worker/trainer/rewards/rule_rewards.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "worker/trainer/rewards/answer_match.h"

namespace trainctl::rewards {
namespace {

struct NamedReward {
  absl::string_view name;
  RuleReward fn;
};

constexpr NamedReward kRuleRewards[] = {
    {"accuracy", &AccuracyReward},
    {"format", &FormatReward},
    {"iou", &IouReward},
};

// Python's \s for ASCII text.
bool IsSpace(char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r'); }

// The numbers of a list's contents "10, 20.5, -3" (commas and/or whitespace between them); nullopt
// when an item is not a number.
std::optional<std::vector<double>> ListNumbers(absl::string_view items) {
  std::vector<double> out;
  for (absl::string_view item :
       absl::StrSplit(items, absl::ByAnyChar(", \t\n\r"), absl::SkipEmpty())) {
    double v;
    if (!absl::SimpleAtod(item, &v)) return std::nullopt;
    out.push_back(v);
  }
  return out;
}

}  // namespace

float AccuracyReward(absl::string_view completion, absl::string_view solution) {
  const std::optional<absl::string_view> answer = ExtractAnswer(completion);
  if (!answer) return 0.0f;
  const absl::string_view reference = ExtractAnswer(solution).value_or(solution);
  return AnswersMatch(*answer, reference) ? 1.0f : 0.0f;
}

float FormatReward(absl::string_view completion, absl::string_view /*solution*/) {
  // re.fullmatch(r"<think>.*?</think>\s*<answer>.*?</answer>", text, re.DOTALL): the text opens
  // with <think>, closes with </answer>, and some </think> in between is followed by optional
  // whitespace and <answer>.
  constexpr absl::string_view kThink = "<think>", kThinkEnd = "</think>", kAnswer = "<answer>",
                              kAnswerEnd = "</answer>";
  if (completion.size() < kThink.size() + kAnswerEnd.size() ||
      !absl::StartsWith(completion, kThink) || !absl::EndsWith(completion, kAnswerEnd)) {
    return 0.0f;
  }
  const absl::string_view middle =
      completion.substr(kThink.size(), completion.size() - kThink.size() - kAnswerEnd.size());
  for (size_t at = middle.find(kThinkEnd); at != absl::string_view::npos;
       at = middle.find(kThinkEnd, at + 1)) {
    size_t i = at + kThinkEnd.size();
    while (i < middle.size() && IsSpace(middle[i])) ++i;
    if (absl::StartsWith(middle.substr(i), kAnswer)) return 1.0f;
  }
  return 0.0f;
}

std::optional<std::array<double, 4>> ParseBox(absl::string_view text) {
  for (size_t open = text.find('['); open != absl::string_view::npos;
       open = text.find('[', open + 1)) {
    const size_t end = text.find_first_of("[]", open + 1);
    if (end == absl::string_view::npos) return std::nullopt;
    if (text[end] == '[') continue;  // an outer list: look inside
    std::optional<std::vector<double>> numbers = ListNumbers(text.substr(open + 1, end - open - 1));
    if (numbers && numbers->size() >= 4) {
      return std::array<double, 4>{(*numbers)[0], (*numbers)[1], (*numbers)[2], (*numbers)[3]};
    }
  }
  return std::nullopt;
}

double BoxIou(const std::array<double, 4>& a, const std::array<double, 4>& b) {
  for (const auto* box : {&a, &b}) {
    for (double v : *box) {
      if (!std::isfinite(v)) return 0;
    }
    if (!((*box)[2] > (*box)[0]) || !((*box)[3] > (*box)[1])) return 0;
  }
  const double iw = std::min(a[2], b[2]) - std::max(a[0], b[0]);
  const double ih = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (iw <= 0 || ih <= 0) return 0;
  const double inter = iw * ih;
  const double area_a = (a[2] - a[0]) * (a[3] - a[1]);
  const double area_b = (b[2] - b[0]) * (b[3] - b[1]);
  return inter / (area_a + area_b - inter);
}

float IouReward(absl::string_view completion, absl::string_view solution) {
  const std::optional<absl::string_view> answer = ExtractAnswer(completion);
  if (!answer) return 0.0f;
  const std::optional<std::array<double, 4>> box = ParseBox(*answer);
  const std::optional<std::array<double, 4>> truth =
      ParseBox(ExtractAnswer(solution).value_or(solution));
  if (!box || !truth) return 0.0f;
  return static_cast<float>(BoxIou(*box, *truth));
}

absl::StatusOr<RuleReward> FindRuleReward(absl::string_view name) {
  for (const NamedReward& reward : kRuleRewards) {
    if (reward.name == name) return reward.fn;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown reward function '", name, "', known: ", absl::StrJoin(RewardFuncNames(), "|")));
}

std::vector<std::string> RuleRewardNames() {
  std::vector<std::string> names;
  for (const NamedReward& reward : kRuleRewards) names.emplace_back(reward.name);
  return names;
}

}  // namespace trainctl::rewards
