#include "coordinator/job_manager.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "coordinator/job_stages.h"
#include "coordinator/job_state.h"
#include "google/protobuf/util/time_util.h"

namespace trainctl {
namespace {

using google::protobuf::util::TimeUtil;
using trainctl::v1::JobState;

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

JobEvent StateChangeEvent(JobState from, JobState to, const std::string& reason, int attempt,
                          const google::protobuf::Timestamp& now) {
  JobEvent event;
  *event.mutable_time() = now;
  auto* change = event.mutable_state_change();
  change->set_from(from);
  change->set_to(to);
  change->set_reason(reason);
  change->set_attempt(attempt);
  return event;
}

// Applies a legal transition to `job` (and its current pipeline stage) and appends the events
// recording it.
absl::Status ApplyTransition(Job* job, JobState to, const std::string& reason,
                             const google::protobuf::Timestamp& now,
                             std::vector<JobEvent>* events) {
  const JobState from = job->state();
  RETURN_IF_ERROR(CheckTransition(from, to));
  if (from == trainctl::v1::JOB_STATE_RESTARTING && to == trainctl::v1::JOB_STATE_SCHEDULED) {
    job->set_attempt(job->attempt() + 1);
  }
  if (to == trainctl::v1::JOB_STATE_RUNNING && !job->has_start_time())
    *job->mutable_start_time() = now;
  if (IsTerminal(to)) *job->mutable_end_time() = now;
  job->set_state(to);
  job->set_message(reason);
  *job->mutable_update_time() = now;
  // A pipeline's stage starts after the job is placed and ends before the job does.
  std::vector<JobEvent> stage_events;
  OnJobStateChange(job, to, reason, now, &stage_events);
  if (!IsTerminal(to)) events->push_back(StateChangeEvent(from, to, reason, job->attempt(), now));
  events->insert(events->end(), stage_events.begin(), stage_events.end());
  if (IsTerminal(to)) events->push_back(StateChangeEvent(from, to, reason, job->attempt(), now));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SubmitResult> JobManager::Submit(const trainctl::v1::JobSpec& spec,
                                                const std::string& request_id) {
  ASSIGN_OR_RETURN(ValidatedJobSpec validated, ValidateJobSpec(spec));
  const auto now = ToProto(clock_->Now());
  Job job;
  *job.mutable_spec() = std::move(validated.spec);
  job.set_state(trainctl::v1::JOB_STATE_PENDING);
  job.set_resolved_deepspeed_config_json(std::move(validated.resolved_deepspeed_config_json));
  *job.mutable_create_time() = now;
  *job.mutable_update_time() = now;
  RETURN_IF_ERROR(InitStages(&job));
  std::vector<JobEvent> events = {StateChangeEvent(
      trainctl::v1::JOB_STATE_UNSPECIFIED, trainctl::v1::JOB_STATE_PENDING, "submitted", 0, now)};
  TagEventsWithStage(job, &events);
  ASSIGN_OR_RETURN(CreateJobResult created, store_->CreateJob(job, request_id, std::move(events)));
  if (created.created) {
    notifier_->Notify(created.job.id());
    if (listener_) listener_(created.job.id());
  }
  return SubmitResult{std::move(created.job), created.created, std::move(validated.warnings)};
}

absl::StatusOr<Job> JobManager::Get(absl::string_view id) { return store_->GetJob(id); }

absl::StatusOr<JobPage> JobManager::List(const JobFilter& filter) {
  if (filter.page_size <= 0 || filter.page_size > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be in [1, 1000], got ", filter.page_size));
  }
  ASSIGN_OR_RETURN(JobPage page, store_->ListJobs(filter));
  size_t bytes = 0;
  for (size_t i = 0; i < page.jobs.size(); ++i) {
    bytes += page.jobs[i].ByteSizeLong();
    if (i > 0 && bytes > kMaxJobPageBytes) {
      page.jobs.resize(i);
      page.next_before_id = ParseJobId(page.jobs.back().id()).value_or(0);
      break;
    }
  }
  return page;
}

absl::StatusOr<Job> JobManager::Update(absl::string_view id, const JobMutation& mutate) {
  std::vector<JobEvent> events;
  auto tagged = [&mutate](Job* job, std::vector<JobEvent>* added) -> absl::Status {
    RETURN_IF_ERROR(mutate(job, added));
    TagEventsWithStage(*job, added);
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(Job job, store_->UpdateJob(id, tagged, &events));
  if (!events.empty()) notifier_->Notify(job.id());
  return job;
}

absl::StatusOr<Job> JobManager::Cancel(absl::string_view id, const std::string& reason) {
  const auto now = ToProto(clock_->Now());
  const std::string why =
      reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  auto cancelled = Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    switch (job->state()) {
      case trainctl::v1::JOB_STATE_CANCELLED:
        return absl::OkStatus();  // cancelling twice is not an error
      case trainctl::v1::JOB_STATE_PENDING:
      case trainctl::v1::JOB_STATE_RESTARTING: {
        job->set_cancel_requested(true);
        return ApplyTransition(job, trainctl::v1::JOB_STATE_CANCELLED, why, now, events);
      }
      case trainctl::v1::JOB_STATE_SCHEDULED:
      case trainctl::v1::JOB_STATE_RUNNING:
        // Its ranks are live: the workers stop them and report the cancelled state.
        job->set_cancel_requested(true);
        job->set_message(why);
        *job->mutable_update_time() = now;
        return absl::OkStatus();
      default:
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", job->id(), " already ", JobStateName(job->state()), "; nothing to cancel"));
    }
  });
  if (cancelled.ok() && listener_) listener_(cancelled->id());
  return cancelled;
}

absl::StatusOr<Job> JobManager::Transition(absl::string_view id, trainctl::v1::JobState to,
                                           const std::string& reason) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    return ApplyTransition(job, to, reason, now, events);
  });
}

absl::StatusOr<Job> JobManager::AdvanceStage(absl::string_view id, const std::string& reason) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    RETURN_IF_ERROR(CheckTransition(job->state(), trainctl::v1::JOB_STATE_PENDING));
    const std::string done = CurrentStageLabel(*job);
    RETURN_IF_ERROR(trainctl::AdvanceStage(job, reason, now, events));
    return ApplyTransition(
        job, trainctl::v1::JOB_STATE_PENDING,
        absl::StrCat("stage ", done, " succeeded; next: stage ", CurrentStageLabel(*job)), now,
        events);
  });
}

absl::StatusOr<Job> JobManager::Place(absl::string_view id, const std::vector<std::string>& nodes,
                                      const std::string& reason) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    // A pipeline stored before stages were recorded (an older schema) gets them now.
    if (job->stages_size() == 0) RETURN_IF_ERROR(InitStages(job));
    RETURN_IF_ERROR(ApplyTransition(job, trainctl::v1::JOB_STATE_SCHEDULED, reason, now, events));
    job->mutable_nodes()->Assign(nodes.begin(), nodes.end());
    return absl::OkStatus();
  });
}

absl::StatusOr<Job> JobManager::RecordMetric(absl::string_view id,
                                             const trainctl::v1::MetricSample& sample) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    auto* progress = job->mutable_progress();
    progress->set_step(std::max(progress->step(), sample.step()));
    if (auto it = sample.values().find("loss"); it != sample.values().end())
      progress->set_loss(it->second);
    if (auto it = sample.values().find("epoch"); it != sample.values().end())
      progress->set_epoch(it->second);
    if (auto it = sample.values().find("total_steps"); it != sample.values().end()) {
      progress->set_total_steps(static_cast<int64_t>(it->second));
    }
    RecordStageFigures(job, sample);
    *job->mutable_update_time() = now;
    JobEvent event;
    *event.mutable_time() = now;
    *event.mutable_metric() = sample;
    events->push_back(std::move(event));
    return absl::OkStatus();
  });
}

absl::StatusOr<Job> JobManager::RecordCheckpoint(absl::string_view id,
                                                 const trainctl::v1::Checkpoint& checkpoint) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    if (checkpoint.path().empty()) return absl::InvalidArgumentError("checkpoint.path: required");
    *job->mutable_last_checkpoint() = checkpoint;
    if (!job->last_checkpoint().has_time()) *job->mutable_last_checkpoint()->mutable_time() = now;
    *job->mutable_update_time() = now;
    JobEvent event;
    *event.mutable_time() = now;
    *event.mutable_checkpoint() = job->last_checkpoint();
    events->push_back(std::move(event));
    return absl::OkStatus();
  });
}

absl::StatusOr<Job> JobManager::RecordWarning(absl::string_view id, const std::string& source,
                                              const std::string& message) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job*, std::vector<JobEvent>* events) -> absl::Status {
    JobEvent event;
    *event.mutable_time() = now;
    event.mutable_warning()->set_source(source);
    event.mutable_warning()->set_message(message);
    events->push_back(std::move(event));
    return absl::OkStatus();
  });
}

absl::StatusOr<Job> JobManager::SetMessage(absl::string_view id, const std::string& message) {
  ASSIGN_OR_RETURN(Job current, store_->GetJob(id));
  if (current.message() == message) return current;  // nothing to write (e.g. after a restart)
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>*) -> absl::Status {
    job->set_message(message);
    *job->mutable_update_time() = now;
    return absl::OkStatus();
  });
}

absl::Status JobManager::AppendLogs(std::vector<LogLine> lines) {
  const auto now = ToProto(clock_->Now());
  for (LogLine& line : lines) {
    if (!line.has_time()) *line.mutable_time() = now;
  }
  RETURN_IF_ERROR(store_->AppendLogs(&lines));
  std::set<std::string> jobs;
  for (const LogLine& line : lines) jobs.insert(line.job_id());
  for (const std::string& id : jobs) notifier_->Notify(id);
  return absl::OkStatus();
}

}  // namespace trainctl
