#include "worker/trainer/stages/eval_metrics.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

namespace {

// One row per figure of `table` (the overall table or a dataset's) of the last column (the model),
// across `columns`; "-" where a column has no such figure.
void AddRows(const std::vector<const nlohmann::json*>& columns, const std::string& title,
             const std::function<const nlohmann::json*(const nlohmann::json&)>& table,
             std::string* out) {
  const nlohmann::json* rows = table(*columns.back());
  if (rows == nullptr) return;
  if (!title.empty()) absl::StrAppend(out, title, "\n");
  for (const auto& [name, unused] : rows->items()) {
    if (name == "prompts" || name == "completions") continue;
    absl::StrAppend(out, absl::StrFormat("  %-24s", name));
    for (const nlohmann::json* column : columns) {
      const nlohmann::json* t = table(*column);
      if (t != nullptr && t->contains(name) && (*t)[name].is_number()) {
        absl::StrAppend(out, absl::StrFormat("  %12.3f", (*t)[name].get<double>()));
      } else {
        absl::StrAppend(out, absl::StrFormat("  %12s", "-"));
      }
    }
    absl::StrAppend(out, "\n");
  }
}

}  // namespace

std::string FormatEvalTable(const nlohmann::json& doc) {
  std::vector<const nlohmann::json*> columns;
  std::string header = absl::StrFormat("  %-24s", "");
  if (doc.contains("baseline")) columns.push_back(&doc["baseline"]);
  columns.push_back(&doc);
  for (size_t i = 0; i < columns.size(); ++i) {
    absl::StrAppend(&header, absl::StrFormat("  %12s", i + 1 < columns.size() ? "baseline" : "model"));
  }
  std::string out;
  const nlohmann::json overall = doc.value("overall", nlohmann::json::object());
  absl::StrAppend(&out, "eval: ", overall.value("prompts", int64_t{0}), " prompts, ",
                  overall.value("completions", int64_t{0}), " completions\n");
  for (size_t i = 0; i < columns.size(); ++i) {
    absl::StrAppend(&out, "  ", i + 1 < columns.size() ? "baseline" : "model", ": ",
                    columns[i]->value("model", std::string("?")), "\n");
  }
  absl::StrAppend(&out, header, "\n");
  auto overall_of = [](const nlohmann::json& d) -> const nlohmann::json* {
    return d.contains("overall") ? &d["overall"] : nullptr;
  };
  AddRows(columns, "", overall_of, &out);
  const nlohmann::json by = doc.value("by_dataset", nlohmann::json::object());
  if (by.size() > 1) {
    for (const auto& [dataset, unused] : by.items()) {
      const std::string name = dataset;
      AddRows(
          columns, "dataset " + name,
          [&](const nlohmann::json& d) -> const nlohmann::json* {
            if (!d.contains("by_dataset") || !d["by_dataset"].contains(name)) return nullptr;
            return &d["by_dataset"][name];
          },
          &out);
    }
  }
  return out;
}

}  // namespace trainctl::trainer
