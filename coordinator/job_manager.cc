#include "coordinator/job_manager.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "coordinator/job_stages.h"
#include "coordinator/job_state.h"
#include "coordinator/memory_fit.h"
#include "coordinator/metric_history.h"
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

// The weight per step of the newest interval in Progress.step_time's moving average: an interval
// of k steps weighs 1 - (1 - w)^k, as k one-step samples would, so the average spans about 1/w = 20
// steps whatever logging_steps is.
constexpr double kStepTimeSmoothing = 0.05;

// Folds a metric sample of `attempt` at `step`, logged at `time`, into the progress's step time
// and ETA (see Progress.step_time in job.proto for why it is measured this way).
void UpdateStepTime(int32_t attempt, int64_t step, const google::protobuf::Timestamp& time,
                    trainctl::v1::Progress* p) {
  const bool same_attempt = p->has_rate_time() && p->rate_attempt() == attempt;
  const int64_t steps = step - p->rate_step();
  if (same_attempt && steps == 0) return;  // more figures for the same step: same interval
  if (same_attempt && steps > 0) {
    const double seconds = static_cast<double>(TimeUtil::TimestampToMicroseconds(time) -
                                               TimeUtil::TimestampToMicroseconds(p->rate_time())) /
                           1e6;
    if (seconds >= 0) {
      const double per_step = seconds / static_cast<double>(steps);
      const double w = 1 - std::pow(1 - kStepTimeSmoothing, static_cast<double>(steps));
      p->set_step_time(p->step_time() <= 0 ? per_step
                                           : p->step_time() + w * (per_step - p->step_time()));
    }
  }
  // A new attempt, a step that went back (a resume) or a clock that did: a new interval starts.
  p->set_rate_step(step);
  *p->mutable_rate_time() = time;
  p->set_rate_attempt(attempt);
  // The steps left from where the running attempt is, not from the furthest step ever logged.
  const int64_t left = std::max<int64_t>(0, p->total_steps() - step);
  p->set_eta_seconds(p->total_steps() > 0 ? p->step_time() * static_cast<double>(left) : 0);
}

// Records a metric sample (RecordMetric): progress, step time and ETA, stage figures, the event.
JobMutation MetricMutation(trainctl::v1::MetricSample sample, google::protobuf::Timestamp now) {
  return [sample = std::move(sample), now](Job* job, std::vector<JobEvent>* events) {
    auto* progress = job->mutable_progress();
    progress->set_step(std::max(progress->step(), sample.step()));
    if (auto it = sample.values().find("loss"); it != sample.values().end())
      progress->set_loss(it->second);
    if (auto it = sample.values().find("epoch"); it != sample.values().end())
      progress->set_epoch(it->second);
    if (auto it = sample.values().find("total_steps"); it != sample.values().end()) {
      progress->set_total_steps(static_cast<int64_t>(it->second));
    }
    if (auto it = sample.values().find("tokens_per_second"); it != sample.values().end())
      progress->set_tokens_per_second(it->second);
    UpdateStepTime(job->attempt(), sample.step(), sample.has_time() ? sample.time() : now,
                   progress);
    RecordStageFigures(job, sample);
    *job->mutable_update_time() = now;
    JobEvent event;
    *event.mutable_time() = now;
    *event.mutable_metric() = sample;
    events->push_back(std::move(event));
    return absl::OkStatus();
  };
}

// Records a completed checkpoint (RecordCheckpoint). INVALID_ARGUMENT without a path.
JobMutation CheckpointMutation(trainctl::v1::Checkpoint checkpoint,
                               google::protobuf::Timestamp now) {
  return [checkpoint = std::move(checkpoint), now](Job* job,
                                                   std::vector<JobEvent>* events) -> absl::Status {
    if (checkpoint.path().empty()) return absl::InvalidArgumentError("checkpoint.path: required");
    *job->mutable_last_checkpoint() = checkpoint;
    if (!job->last_checkpoint().has_time()) *job->mutable_last_checkpoint()->mutable_time() = now;
    *job->mutable_update_time() = now;
    JobEvent event;
    *event.mutable_time() = now;
    *event.mutable_checkpoint() = job->last_checkpoint();
    events->push_back(std::move(event));
    return absl::OkStatus();
  };
}

// `mutate`, then the pipeline stage's name on the events it added (as JobManager::Update does).
JobMutation TaggedWithStage(JobMutation mutate) {
  return [mutate = std::move(mutate)](Job* job, std::vector<JobEvent>* added) -> absl::Status {
    RETURN_IF_ERROR(mutate(job, added));
    TagEventsWithStage(*job, added);
    return absl::OkStatus();
  };
}

}  // namespace

absl::StatusOr<SubmitResult> JobManager::Submit(const trainctl::v1::JobSpec& spec,
                                                const std::string& request_id,
                                                const std::string& owner,
                                                const SubmitChecks& checks) {
  // The env allowlist's refusals listed with the spec's own problems.
  ASSIGN_OR_RETURN(ValidatedJobSpec validated,
                   ValidateJobSpec(spec, RankEnvErrors(spec.env(), rank_env_, "spec.env")));
  Job job;
  absl::StatusOr<trainctl::v1::MemoryPlan> plan =
      PlanForCluster(validated.spec, validated.resolved_deepspeed_config, checks.nodes);
  if (plan.ok()) {
    const std::optional<int64_t> gpu_bytes = GpuBytesForJob(validated.spec, checks.nodes);
    if (gpu_bytes && !checks.force) {
      RETURN_IF_ERROR(CheckMemoryFit(validated.spec, validated.resolved_deepspeed_config_json,
                                     *plan, *gpu_bytes));
    }
    *job.mutable_memory_plan() = *std::move(plan);
  } else if (validated.spec.kind() != trainctl::v1::JOB_KIND_PROBE) {
    validated.warnings.push_back(absl::StrCat("no memory plan: ", plan.status().message()));
  }
  const auto now = ToProto(clock_->Now());
  *job.mutable_spec() = std::move(validated.spec);
  job.set_state(trainctl::v1::JOB_STATE_PENDING);
  job.set_owner(owner);
  job.set_resolved_deepspeed_config_json(std::move(validated.resolved_deepspeed_config_json));
  *job.mutable_create_time() = now;
  *job.mutable_update_time() = now;
  RETURN_IF_ERROR(InitStages(&job));
  std::vector<JobEvent> events = {StateChangeEvent(
      trainctl::v1::JOB_STATE_UNSPECIFIED, trainctl::v1::JOB_STATE_PENDING, "submitted", 0, now)};
  TagEventsWithStage(job, &events);
  // Idempotency keys are the submitter's own: bob's retry with alice's key makes bob's job. The
  // owner goes first, length-prefixed, so no (owner, key) pair can spell another's.
  const std::string scoped_request_id =
      request_id.empty() ? "" : absl::StrCat(owner.size(), ":", owner, "/", request_id);
  ASSIGN_OR_RETURN(CreateJobResult created,
                   store_->CreateJob(job, scoped_request_id, std::move(events)));
  if (created.created) {
    for (JobObserver* o : observers_) o->OnSubmitted(created.job);
    TellStored(created.job.id());
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
  TellObservers(job, events);
  if (!events.empty()) TellStored(job.id());
  return job;
}

void JobManager::TellStored(const std::string& id) {
  for (JobObserver* o : observers_) o->OnStored(id);
}

void JobManager::TellObservers(const Job& job, const std::vector<JobEvent>& events) {
  for (JobObserver* o : observers_) {
    for (const JobEvent& event : events) {
      if (event.has_state_change() && event.state_change().from() != event.state_change().to()) {
        o->OnStateChanged(job, event.state_change().from());
      } else if (event.has_metric()) {
        o->OnMetric(job, event.metric());
      } else if (event.has_remedy()) {
        o->OnRemedy(job, event.remedy());
      }
    }
  }
}

absl::StatusOr<Job> JobManager::Cancel(absl::string_view id, const std::string& reason,
                                       const std::optional<std::string>& only_owner) {
  const auto now = ToProto(clock_->Now());
  const std::string why =
      reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  bool accepted = false;  // not cancelled or being cancelled before this call
  auto cancelled = Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    if (only_owner.has_value() && job->owner() != *only_owner) {
      return absl::PermissionDeniedError(absl::StrCat(
          *only_owner, " may cancel only its own jobs; job ", job->id(), " belongs to ",
          job->owner().empty() ? std::string("no one (submitted without authentication)")
                               : job->owner()));
    }
    accepted = job->state() != trainctl::v1::JOB_STATE_CANCELLED && !job->cancel_requested();
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
  if (cancelled.ok() && accepted) {
    for (JobObserver* o : observers_) o->OnCancelAccepted(*cancelled);
  }
  return cancelled;
}

absl::StatusOr<Job> JobManager::Transition(absl::string_view id, trainctl::v1::JobState to,
                                           const std::string& reason) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    return ApplyTransition(job, to, reason, now, events);
  });
}

absl::StatusOr<Job> JobManager::RestartWithRemedy(absl::string_view id,
                                                  const trainctl::v1::Remedy& remedy,
                                                  const std::string& reason) {
  const auto now = ToProto(clock_->Now());
  return Update(id, [&](Job* job, std::vector<JobEvent>* events) -> absl::Status {
    RETURN_IF_ERROR(ApplyTransition(job, trainctl::v1::JOB_STATE_RESTARTING, reason, now, events));
    *job->add_remedies() = remedy;
    JobEvent event;
    *event.mutable_time() = now;
    *event.mutable_remedy() = remedy;
    events->push_back(std::move(event));
    return absl::OkStatus();
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
  return Update(id, MetricMutation(sample, ToProto(clock_->Now())));
}

absl::StatusOr<trainctl::v1::GetMetricsResponse> JobManager::GetMetrics(
    absl::string_view id, const std::vector<std::string>& names, int max_points) {
  constexpr int kPage = 1000;
  std::vector<JobEvent> events;
  for (int64_t after = 0;;) {
    // The store bounds a job's metric events (metric_retention.h), so this ends soon.
    ASSIGN_OR_RETURN(std::vector<JobEvent> page, store_->ListEvents(id, after, kPage));
    if (page.empty()) break;
    after = page.back().seq();
    const bool last = page.size() < static_cast<size_t>(kPage);
    for (JobEvent& e : page) {
      if (e.has_metric()) events.push_back(std::move(e));
    }
    if (last) break;
  }
  return BuildMetricHistory(events, names, max_points);
}

absl::StatusOr<Job> JobManager::RecordCheckpoint(absl::string_view id,
                                                 const trainctl::v1::Checkpoint& checkpoint) {
  return Update(id, CheckpointMutation(checkpoint, ToProto(clock_->Now())));
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
  for (const std::string& id : jobs) TellStored(id);
  return absl::OkStatus();
}

BatchRecord JobManager::MetricRecord(const std::string& id, trainctl::v1::MetricSample sample) {
  BatchRecord r;
  r.job_id = id;
  r.mutate = TaggedWithStage(MetricMutation(std::move(sample), ToProto(clock_->Now())));
  return r;
}

BatchRecord JobManager::CheckpointRecord(const std::string& id,
                                         trainctl::v1::Checkpoint checkpoint) {
  BatchRecord r;
  r.job_id = id;
  r.mutate = TaggedWithStage(CheckpointMutation(std::move(checkpoint), ToProto(clock_->Now())));
  return r;
}

BatchRecord JobManager::JobEventRecord(const std::string& id, trainctl::v1::JobEvent event) {
  BatchRecord r;
  r.job_id = id;
  r.mutate = TaggedWithStage([event = std::move(event), now = ToProto(clock_->Now())](
                                 Job*, std::vector<JobEvent>* events) mutable {
    *event.mutable_time() = now;
    events->push_back(std::move(event));
    return absl::OkStatus();
  });
  return r;
}

BatchRecord JobManager::WarningRecord(const std::string& id, const std::string& source,
                                      const std::string& message) {
  const auto now = ToProto(clock_->Now());
  BatchRecord r;
  r.job_id = id;
  r.mutate = TaggedWithStage([=](Job*, std::vector<JobEvent>* events) -> absl::Status {
    JobEvent event;
    *event.mutable_time() = now;
    event.mutable_warning()->set_source(source);
    event.mutable_warning()->set_message(message);
    events->push_back(std::move(event));
    return absl::OkStatus();
  });
  return r;
}

BatchRecord JobManager::LogRecord(std::vector<LogLine> lines) {
  const auto now = ToProto(clock_->Now());
  for (LogLine& line : lines) {
    if (!line.has_time()) *line.mutable_time() = now;
  }
  BatchRecord r;
  r.lines = std::move(lines);
  return r;
}

absl::Status JobManager::WriteBatch(std::vector<BatchRecord>* records) {
  const absl::Status written = store_->WriteBatch(records);
  std::set<std::string> jobs;
  for (const BatchRecord& r : *records) {
    if (!r.status.ok()) continue;
    if (r.job_id.empty()) {
      for (const LogLine& line : r.lines) jobs.insert(line.job_id());
      continue;
    }
    TellObservers(r.job, r.events);
    if (!r.events.empty()) jobs.insert(r.job.id());
  }
  for (const std::string& id : jobs) TellStored(id);
  return written;
}

}  // namespace trainctl
