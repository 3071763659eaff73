#include "cli/watch_view.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl::cli {
namespace {

using google::protobuf::util::TimeUtil;
using trainctl::v1::JobState;

bool IsSet(const google::protobuf::Timestamp& t) { return t.seconds() != 0 || t.nanos() != 0; }

absl::Time ToTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixMicros(TimeUtil::TimestampToMicroseconds(t));
}

bool IsOver(JobState s) {
  return s == trainctl::v1::JOB_STATE_SUCCEEDED || s == trainctl::v1::JOB_STATE_FAILED ||
         s == trainctl::v1::JOB_STATE_CANCELLED;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "running"; "unknown(42)" for a state this binary does not know.
std::string StateWord(JobState s) {
  const auto* value = trainctl::v1::JobState_descriptor()->FindValueByNumber(s);
  if (value == nullptr) return absl::StrCat("unknown(", static_cast<int>(s), ")");
  return Lower(value->name().substr(std::string("JOB_STATE_").size()));
}

}  // namespace

WatchView::WatchView(const trainctl::v1::Job& job)
    : id_(job.id()), state_(job.state()), message_(job.message()) {
  if (IsSet(job.start_time())) start_ = ToTime(job.start_time());
  if (IsSet(job.end_time())) end_ = ToTime(job.end_time());
  step_ = job.progress().step();
  total_steps_ = job.progress().total_steps();
  step_time_ = job.progress().step_time();
}

bool WatchView::OnEvent(const trainctl::v1::JobEvent& e) {
  if (!e.stage().empty()) stage_ = e.stage();
  if (e.has_state_change()) {
    state_ = e.state_change().to();
    message_ = e.state_change().reason();
    if (state_ == trainctl::v1::JOB_STATE_RUNNING && !start_) start_ = ToTime(e.time());
    if (IsOver(state_)) end_ = ToTime(e.time());
    return true;
  }
  if (!e.has_metric()) return true;
  const auto& values = e.metric().values();
  step_ = e.metric().step();
  if (auto it = values.find("total_steps"); it != values.end()) {
    total_steps_ = static_cast<int64_t>(it->second);
  }
  if (auto it = values.find("loss"); it != values.end()) {
    loss_ = it->second;
    if (!first_loss_) first_loss_ = it->second;
  }
  if (auto it = values.find("tokens_per_second"); it != values.end()) {
    tokens_per_second_ = it->second;
  }
  return false;
}

void WatchView::OnJob(const trainctl::v1::Job& job, absl::Time now) {
  const auto& p = job.progress();
  if (total_steps_ == 0) total_steps_ = p.total_steps();
  if (p.step_time() > 0) step_time_ = p.step_time();
  // A new estimate only when the coordinator has seen a new sample; counting down from the
  // first time we saw it.
  if (!eta_at_ ||
      !google::protobuf::util::MessageDifferencer::Equals(p.rate_time(), eta_sample_time_)) {
    eta_sample_time_ = p.rate_time();
    eta_seconds_ = p.eta_seconds();
    eta_at_ = now;
  }
  if (!start_ && IsSet(job.start_time())) start_ = ToTime(job.start_time());
}

ProgressView WatchView::View(absl::Time now) const {
  ProgressView v;
  v.job_id = id_;
  v.state = StateWord(state_);
  v.stage = stage_;
  v.step = step_;
  v.total_steps = total_steps_;
  v.has_loss = loss_.has_value();
  v.loss = loss_.value_or(0);
  v.tokens_per_second = tokens_per_second_;
  if (state_ == trainctl::v1::JOB_STATE_RUNNING && eta_at_ && eta_seconds_ > 0) {
    v.eta_seconds = std::max(0.0, eta_seconds_ - absl::ToDoubleSeconds(now - *eta_at_));
  }
  if (start_) v.elapsed_seconds = absl::ToDoubleSeconds(end_.value_or(now) - *start_);
  return v;
}

std::string WatchView::Summary(absl::Time now) const {
  std::string out = absl::StrCat(id_, " ", StateWord(state_));
  if (start_) {
    absl::StrAppend(&out, " after ",
                    FormatDuration(absl::ToDoubleSeconds(end_.value_or(now) - *start_)));
  }
  std::vector<std::string> parts;
  if (total_steps_ > 0) {
    parts.push_back(absl::StrCat("step ", step_, "/", total_steps_));
  } else if (step_ > 0) {
    parts.push_back(absl::StrCat("step ", step_));
  }
  if (loss_) {
    parts.push_back(*first_loss_ == *loss_
                        ? absl::StrFormat("loss %.4g", *loss_)
                        : absl::StrFormat("loss %.4g -> %.4g", *first_loss_, *loss_));
  }
  if (step_time_ > 0) parts.push_back(absl::StrFormat("%.3g s/step", step_time_));
  if (!parts.empty()) absl::StrAppend(&out, ": ", absl::StrJoin(parts, ", "));
  if (state_ != trainctl::v1::JOB_STATE_SUCCEEDED && !message_.empty()) {
    absl::StrAppend(&out, " (", message_, ")");
  }
  return out;
}

}  // namespace trainctl::cli
