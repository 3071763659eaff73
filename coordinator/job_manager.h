// JobManager: owns the lifecycle of jobs. Validates and stores submitted specs, moves jobs through
// the state machine (job_state.h), records progress, checkpoints and log lines, and wakes watchers.
// Includes no gRPC: JobServiceImpl translates to and from it. Thread-safe (the store serialises).
#ifndef TRAINCTL_COORDINATOR_JOB_MANAGER_H_
#define TRAINCTL_COORDINATOR_JOB_MANAGER_H_

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/rank_env.h"
#include "coordinator/job_observer.h"
#include "coordinator/job_store.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl {

// What Submit checks the job's memory plan against (coordinator/memory_fit.h).
struct SubmitChecks {
  // The cluster's nodes (ListNodes); empty: none known, the plan is made for GPUs and not checked.
  std::vector<trainctl::v1::Node> nodes;
  bool force = false;  // accept a plan that does not fit
};

struct SubmitResult {
  Job job;
  bool created = false;  // false: the request_id was seen before; `job` is the one made then
  std::vector<std::string> warnings;
};

class JobManager {
 public:
  // Does not take ownership; both must outlive the manager. `rank_env`: what a job's env may set
  // in its ranks (common/rank_env.h); Submit refuses other names.
  JobManager(JobStore* store, Clock* clock, RankEnvPolicy rank_env = RankEnvPolicy())
      : store_(store), clock_(clock), rank_env_(std::move(rank_env)) {}

  // Validates the spec (INVALID_ARGUMENT listing every problem), plans its memory
  // (Job.memory_plan; FAILED_PRECONDITION with the plan and the changes that would fit when it
  // does not fit the GPUs of `checks.nodes`, unless checks.force), stores the job as pending with
  // its defaults applied and its DeepSpeed config resolved, and returns it once committed.
  // `owner` (who submitted it; "" without authentication) is kept in Job.owner.
  absl::StatusOr<SubmitResult> Submit(const trainctl::v1::JobSpec& spec,
                                      const std::string& request_id, const std::string& owner = "",
                                      const SubmitChecks& checks = {});

  absl::StatusOr<Job> Get(absl::string_view id);

  // A page of jobs, newest first: at most filter.page_size (1..1000, else INVALID_ARGUMENT) and,
  // past the first job, at most kMaxJobPageBytes of them serialized, so any page fits in a
  // response; next_before_id continues after the last one.
  static constexpr size_t kMaxJobPageBytes = 2 << 20;
  absl::StatusOr<JobPage> List(const JobFilter& filter);

  // Cancels a job that has not been placed at once; a placed one is marked cancel_requested and
  // stopped by its workers. Cancelling a cancelled job returns it unchanged; a succeeded or failed
  // one is FAILED_PRECONDITION. With `only_owner`, a job whose owner is another is left alone:
  // PERMISSION_DENIED naming both.
  absl::StatusOr<Job> Cancel(absl::string_view id, const std::string& reason,
                             const std::optional<std::string>& only_owner = std::nullopt);

  // Moves the job to `to` (FAILED_PRECONDITION if the state machine forbids it), stamping start/end
  // times and the attempt counter, and records a state_change event.
  absl::StatusOr<Job> Transition(absl::string_view id, trainctl::v1::JobState to,
                                 const std::string& reason);

  // Transition to restarting, as Transition, and in the same write `remedy` appended to
  // Job.remedies (its settings in force from remedy.attempt on) and recorded as a remedy event
  // after the state change. FAILED_PRECONDITION as Transition.
  absl::StatusOr<Job> RestartWithRemedy(absl::string_view id, const trainctl::v1::Remedy& remedy,
                                        const std::string& reason);

  // A pipeline whose current stage's tasks all succeeded and that has another stage: records the
  // stage as succeeded (stage_change event) and moves the job to pending for the next stage, with
  // attempt, progress, last checkpoint and nodes starting again. FAILED_PRECONDITION when the job
  // is not running or no stage follows.
  absl::StatusOr<Job> AdvanceStage(absl::string_view id, const std::string& reason);

  // Transition to scheduled on `nodes` (by node rank), kept in Job.nodes for the attempt. A
  // pipeline's current stage starts running with its first placement.
  absl::StatusOr<Job> Place(absl::string_view id, const std::vector<std::string>& nodes,
                            const std::string& reason);

  // Records a metric sample (updating progress, and a pipeline's current stage's figures) or a
  // completed checkpoint as job events. A pipeline's events name its current stage. A metric
  // sample also updates the smoothed step time, ETA and tokens/s (Progress in job.proto).
  absl::StatusOr<Job> RecordMetric(absl::string_view id, const trainctl::v1::MetricSample& sample);
  absl::StatusOr<Job> RecordCheckpoint(absl::string_view id,
                                       const trainctl::v1::Checkpoint& checkpoint);

  // The job's metric history, one series per (stage, name), at most `max_points` points each
  // (coordinator/metric_history.h). NOT_FOUND for an unknown job, INVALID_ARGUMENT for a bad
  // max_points or an empty name.
  absl::StatusOr<trainctl::v1::GetMetricsResponse> GetMetrics(absl::string_view id,
                                                              const std::vector<std::string>& names,
                                                              int max_points);

  // Records a warning event (something went wrong that does not change the job's state), e.g. a
  // worker set aside a message of the job. NOT_FOUND for an unknown job.
  absl::StatusOr<Job> RecordWarning(absl::string_view id, const std::string& source,
                                    const std::string& message);

  // Replaces the job's message (why it is in its state) without changing the state, e.g. why a
  // pending job cannot be placed. No event; watchers see it on their next read. The same message
  // again writes nothing.
  absl::StatusOr<Job> SetMessage(absl::string_view id, const std::string& message);

  // Stores rank log lines (each names its job) and wakes their followers.
  absl::Status AppendLogs(std::vector<LogLine> lines);

  // What RecordMetric, RecordCheckpoint and AppendLogs write, as records of one WriteBatch (the
  // cluster's event ingester writes many worker messages at once).
  BatchRecord MetricRecord(const std::string& id, trainctl::v1::MetricSample sample);
  BatchRecord CheckpointRecord(const std::string& id, trainctl::v1::Checkpoint checkpoint);
  // `event` as it is (a diagnostics report, or a warning about a broken one), stamped now and
  // tagged with the current pipeline stage.
  BatchRecord JobEventRecord(const std::string& id, trainctl::v1::JobEvent event);
  BatchRecord LogRecord(std::vector<LogLine> lines);
  // What RecordWarning writes (a rank's typed warning: out of memory, loss spike).
  BatchRecord WarningRecord(const std::string& id, const std::string& source,
                            const std::string& message);
  // Writes them (JobStore::WriteBatch), then wakes the followers and tells the observer of what
  // was written. Returns the store's status; each record's own says whether it was written.
  absl::Status WriteBatch(std::vector<BatchRecord>* records);

  // The one way a change is announced: every observer is told, on the caller's thread, in the
  // order they were added (the watchers' JobNotifier, the metrics, the scheduler).
  // Not owned: an observer is removed before it goes. Add and remove while no call is in flight
  // (before serving, or when a cluster is replaced).
  void AddObserver(JobObserver* observer) { observers_.push_back(observer); }
  void RemoveObserver(JobObserver* observer) {
    observers_.erase(std::remove(observers_.begin(), observers_.end(), observer), observers_.end());
  }
  // Tells the observers how many bytes of log text the job has stored (the event ingester's count).
  void ReportLogBytes(const std::string& id, int64_t bytes) {
    for (JobObserver* o : observers_) o->OnLogBytes(id, bytes);
  }

  JobStore* store() { return store_; }

 private:
  absl::StatusOr<Job> Update(absl::string_view id, const JobMutation& mutate);
  // The committed state changes, metric samples and remedies among `events`, to the observers.
  void TellObservers(const Job& job, const std::vector<JobEvent>& events);
  // Something the job's watchers read was stored: OnStored to the observers.
  void TellStored(const std::string& id);

  JobStore* const store_;
  Clock* const clock_;
  std::vector<JobObserver*> observers_;
  const RankEnvPolicy rank_env_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_JOB_MANAGER_H_
