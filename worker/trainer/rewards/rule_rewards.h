// Rule rewards for GRPO: functions of a completion's text and its record's solution text, named as
// a job spec's reward_funcs names them (RewardFuncNames() in common/job_spec.h). Each returns a
// reward in [0, 1] and never fails: text they cannot read scores 0.
//
//   accuracy  open-r1-multimodal's accuracy_reward: the completion's <answer>...</answer> equals
//             the solution's (its own <answer> part when it has one, else all of it), as numbers,
//             choice letters or normalised text (answer_match.h). 1 or 0.
//   format    open-r1-multimodal's format_reward: the whole completion is
//             <think>...</think> whitespace <answer>...</answer>. 1 or 0.
//   iou       VLM-R1's grounding reward: the IoU of the first box [x1, y1, x2, y2] in the
//             completion's answer with the first box in the solution.
//
// Pure functions; thread-safe.
#ifndef TRAINCTL_WORKER_TRAINER_REWARDS_RULE_REWARDS_H_
#define TRAINCTL_WORKER_TRAINER_REWARDS_RULE_REWARDS_H_

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::rewards {

// A rule reward: (completion, solution) -> reward.
using RuleReward = float (*)(absl::string_view completion, absl::string_view solution);

float AccuracyReward(absl::string_view completion, absl::string_view solution);
// `solution` is unused.
float FormatReward(absl::string_view completion, absl::string_view solution);
float IouReward(absl::string_view completion, absl::string_view solution);

// The reward function called `name`. INVALID_ARGUMENT listing the known names when there is none.
absl::StatusOr<RuleReward> FindRuleReward(absl::string_view name);

// The names FindRuleReward knows, in its table's order (a test checks they are RewardFuncNames()).
std::vector<std::string> RuleRewardNames();

// The first bracketed list of at least four numbers in `text` ("[10, 20, 30.5, 40]", also inside
// JSON such as {"bbox_2d": [10, 20, 30, 40]} or [[10, 20, 30, 40]]): its first four numbers.
std::optional<std::array<double, 4>> ParseBox(absl::string_view text);

// Intersection over union of two boxes [x1, y1, x2, y2] in continuous coordinates (VLM-R1's +1
// pixel convention is not used); 0 when either box is degenerate (x2 <= x1, y2 <= y1, not finite).
double BoxIou(const std::array<double, 4>& a, const std::array<double, 4>& b);

}  // namespace trainctl::rewards

#endif  // TRAINCTL_WORKER_TRAINER_REWARDS_RULE_REWARDS_H_
