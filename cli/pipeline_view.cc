#include "cli/pipeline_view.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl::cli {
namespace {

namespace v1 = trainctl::v1;

// The figures a reader looks for first, in this order (SFT/distill loss, GRPO reward, eval).
constexpr const char* kTelling[] = {"loss",   "reward",       "accuracy",    "format_rate", "kl",
                                    "pass@1", "reward_model", "mean_length", "kd_loss"};
// Rates, counters and schedules: not a stage's result.
constexpr const char* kNoise[] = {
    "learning_rate",     "grad_norm",          "epoch",      "total_steps", "step_time",
    "tokens_per_second", "samples_per_second", "reward_std", "completions", "prompts"};

std::string StageStateName(v1::StageState state) {
  return EnumNumberName(v1::StageState_descriptor(), state);
}

absl::Time ToTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixMicros(google::protobuf::util::TimeUtil::TimestampToMicroseconds(t));
}

bool IsSet(const google::protobuf::Timestamp& t) { return t.seconds() != 0 || t.nanos() != 0; }

std::string ShortDuration(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", s % 60, "s");
  return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
}

std::string FromStage(const std::string& value, const std::string& from) {
  if (value.empty()) return "-";
  return from.empty() ? value : absl::StrCat(value, " ← ", from);
}

}  // namespace

std::string KindColumn(const v1::Job& job) {
  const std::string kind = JobKindName(job.spec().kind());
  const int i = job.current_stage();
  if (job.spec().kind() != v1::JOB_KIND_PIPELINE || i < 0 || i >= job.stages_size()) return kind;
  return absl::StrCat(kind, " ", i + 1, "/", job.stages_size(), " ", job.stages(i).name());
}

std::string HeadlineFigures(const google::protobuf::Map<std::string, double>& figures, int max) {
  std::vector<std::string> parts;
  std::set<std::string> shown;
  auto add = [&](const std::string& name, double value) {
    if (static_cast<int>(parts.size()) >= max || !shown.insert(name).second) return;
    parts.push_back(absl::StrFormat("%s=%.4g", name, value));
  };
  for (const char* name : kTelling) {
    if (auto it = figures.find(name); it != figures.end()) add(name, it->second);
  }
  std::vector<std::string> others;
  for (const auto& [name, value] : figures) {
    if (std::find(std::begin(kNoise), std::end(kNoise), name) == std::end(kNoise)) {
      others.push_back(name);
    }
  }
  std::sort(others.begin(), others.end());
  for (const std::string& name : others) add(name, figures.at(name));
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

void PrintStages(const v1::Job& job, absl::Time now, std::ostream& out) {
  const bool job_over = job.state() == v1::JOB_STATE_SUCCEEDED ||
                        job.state() == v1::JOB_STATE_FAILED ||
                        job.state() == v1::JOB_STATE_CANCELLED;
  Table table({"  #", "STAGE", "KIND", "STATE", "MODEL", "DATA", "OUTPUT", "FIGURES", "DURATION"});
  for (int i = 0; i < job.stages_size(); ++i) {
    const v1::StageStatus& s = job.stages(i);
    std::string state = StageStateName(s.state());
    // A stage the job never reached, once the job is over.
    if (job_over && s.state() == v1::STAGE_STATE_PENDING) state = "skipped";
    if (s.restarts() > 0) absl::StrAppend(&state, " (", s.restarts(), " restarts)");
    std::string duration = "-";
    if (IsSet(s.start_time())) {
      const absl::Time end = IsSet(s.end_time()) ? ToTime(s.end_time()) : now;
      duration = ShortDuration(end - ToTime(s.start_time()));
    }
    table.AddRow(
        {absl::StrCat(i == job.current_stage() && !job_over ? "* " : "  ", i + 1), s.name(),
         JobKindName(s.kind()), state, FromStage(s.model_name_or_path(), s.model_from()),
         FromStage(s.data_path(), s.data_from()), s.output_dir().empty() ? "-" : s.output_dir(),
         HeadlineFigures(s.figures()), duration});
  }
  table.Print(out);
}

std::string DescribeStageChange(const v1::StageChange& change) {
  std::string text = absl::StrCat("stage      ", change.index() + 1, " ", change.name(), " ",
                                  StageStateName(change.state()));
  if (!change.reason().empty() && change.reason() != "started") {
    absl::StrAppend(&text, "  (", change.reason(), ")");
  }
  if (!change.figures().empty()) absl::StrAppend(&text, "  ", HeadlineFigures(change.figures()));
  return text;
}

}  // namespace trainctl::cli
