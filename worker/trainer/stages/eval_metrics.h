// Eval's arithmetic, apart from the model so it is tested on hand-computed values: pass@k and the
// table of one model on one dataset.
//
// Pure; thread-compatible.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_EVAL_METRICS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_EVAL_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace trainctl::trainer {

// The unbiased pass@k estimator of the Codex paper (Chen et al. 2021, eq. 1) for one problem with
// `n` samples of which `c` are correct: 1 - C(n - c, k) / C(n, k), computed as the product
// 1 - prod_{i = n-c+1}^{n} (1 - k / i), which stays finite for large n. Requires 0 <= c <= n and
// 1 <= k <= n; returns 0 otherwise.
double PassAtK(int64_t n, int64_t c, int64_t k);

// One prompt's results: its `n` completions' sums.
struct PromptResult {
  int64_t n = 0;            // completions
  int64_t correct = 0;      // accuracy reward 1
  double format = 0;        // sum of format rewards
  double length = 0;        // sum of completion lengths in tokens
  double reward_model = 0;  // sum of reward model scores
};

// The table of one model on one dataset (or all of them): prompt results summed.
class EvalTable {
 public:
  void Add(const PromptResult& prompt);

  int64_t prompts() const { return prompts_; }
  int64_t completions() const { return completions_; }
  // The fraction of completions the accuracy reward scores 1 (= mean pass@1).
  double accuracy() const;
  double format_rate() const;
  double mean_completion_length() const;
  double reward_model_mean() const;
  // Mean over prompts of PassAtK(n, c, k); prompts with fewer than k completions count 0.
  double pass_at(int64_t k) const;

  // {"prompts", "completions", "accuracy", "format_rate", "pass@1", "pass@<k>",
  //  "mean_completion_length"} and "reward_model_score" when `with_reward_model`. `k` is the
  // completions per prompt; pass@k is left out when k == 1 (it is pass@1).
  nlohmann::json ToJson(int64_t k, bool with_reward_model) const;

 private:
  int64_t prompts_ = 0, completions_ = 0, correct_ = 0;
  double format_ = 0, length_ = 0, reward_model_ = 0;
  std::vector<int64_t> n_, c_;  // per prompt, for pass@k of any k
};

// eval.json (`doc`: "model", "overall", "by_dataset", maybe "baseline") as a text table for the
// log, one column per model (the baseline's first, when there is one), one row per figure; the
// per-dataset rows follow when there is more than one dataset:
//
//   eval: 24 prompts x 4 completions   baseline: tiny   model: /out/grpo
//   accuracy                          0.000           0.292
//   ...
std::string FormatEvalTable(const nlohmann::json& doc);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_EVAL_METRICS_H_
