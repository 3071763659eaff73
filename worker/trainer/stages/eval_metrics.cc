#include "worker/trainer/stages/eval_metrics.h"

#include "absl/strings/str_cat.h"

namespace trainctl::trainer {

double PassAtK(int64_t n, int64_t c, int64_t k) {
  if (c < 0 || c > n || k < 1 || k > n) return 0;
  if (n - c < k) return 1;
  double all_wrong = 1;  // C(n - c, k) / C(n, k)
  for (int64_t i = n - c + 1; i <= n; ++i) {
    all_wrong *= 1 - static_cast<double>(k) / static_cast<double>(i);
  }
  return 1 - all_wrong;
}

void EvalTable::Add(const PromptResult& p) {
  ++prompts_;
  completions_ += p.n;
  correct_ += p.correct;
  format_ += p.format;
  length_ += p.length;
  reward_model_ += p.reward_model;
  n_.push_back(p.n);
  c_.push_back(p.correct);
}

namespace {
double Ratio(double a, double b) { return b > 0 ? a / b : 0; }
}  // namespace

double EvalTable::accuracy() const { return Ratio(static_cast<double>(correct_), completions_); }
double EvalTable::format_rate() const { return Ratio(format_, completions_); }
double EvalTable::mean_completion_length() const { return Ratio(length_, completions_); }
double EvalTable::reward_model_mean() const { return Ratio(reward_model_, completions_); }

double EvalTable::pass_at(int64_t k) const {
  double sum = 0;
  for (size_t i = 0; i < n_.size(); ++i) sum += PassAtK(n_[i], c_[i], k);
  return Ratio(sum, static_cast<double>(prompts_));
}

nlohmann::json EvalTable::ToJson(int64_t k, bool with_reward_model) const {
  nlohmann::json out = {
      {"prompts", prompts_},    {"completions", completions_},
      {"accuracy", accuracy()}, {"format_rate", format_rate()},
      {"pass@1", pass_at(1)},   {"mean_completion_length", mean_completion_length()}};
  if (k > 1) out[absl::StrCat("pass@", k)] = pass_at(k);
  if (with_reward_model) out["reward_model_score"] = reward_model_mean();
  return out;
}

}  // namespace trainctl::trainer
