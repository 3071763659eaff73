// GangRunner: the coordinator's placed jobs, from placement to their end. It places waiting jobs
// (scheduler.h), launches their ranks, follows what their workers report, and decides each run's
// end: success, the next pipeline stage, a restart (with a remedy when one applies), failure or
// cancel. Worker sessions (Cluster, cluster.h) hand it what they have checked and acknowledged.
//
// A placed job runs as one task per node: task `n` runs ranks [n*M, (n+1)*M) of an N x M gang.
// Node rank 0 is launched first; its worker picks the rendezvous port and reports it, and only
// then are the other nodes launched with MASTER_ADDR/MASTER_PORT pointing at it. What a task
// runs is decided by ResolveJobLaunch (job_launch.h) and sent as a LaunchTask.
//
// A pipeline job runs one stage at a time, each as a placement of its own: its tasks are launched
// with the stage's job spec and DeepSpeed config (common/pipeline_spec.h), so workers and trainers
// see an ordinary job, and task ids name the stage ("job-7.s1.0.0"). When every task of a stage
// succeeded the job goes back to pending for the next stage (JobManager::AdvanceStage), placed
// anew by the scheduler; after the last one it succeeds. Restarts, cancel and recovery below apply
// to the current stage only: a finished stage is recorded in the store and never runs again.
//
// Faults:
// - A task that fails (a rank exited non-zero) stops the job's other tasks (fail fast). Once every
//   task has ended the job restarts (`restarting`, then a new attempt placed anywhere, resuming
//   from its last complete checkpoint) while spec.max_restarts allows, else it fails with the
//   reason.
// - A job whose spec asks for remedies (spec.remedies) and whose first failed rank exited with a
//   trainer exit code that has one (common/trainer_exit_codes.h) restarts with the next remedy
//   (coordinator/remedy_ladder.h) recorded in Job.remedies; every later attempt is launched with
//   the spec those remedies make, its DeepSpeed config resolved again (job_launch.h).
// - A lost node's tasks count as failed (NodeLost). A launch its worker does not confirm within
//   launch_timeout fails.
// - A job end that cannot be stored is retried every tick, and a task status whose effects could
//   not be stored returns the store's error, so that its session does not acknowledge it.
// - A worker that reconnects reports the tasks it still holds; they are adopted, not failed
//   (Reconcile). A restarted coordinator reloads placed jobs from the store (Recover) and waits
//   `recovery_grace` for their workers to report them before counting the missing tasks as failed.
//
// Threading: none of its own. Every method runs on the cluster's loop thread.
#ifndef TRAINCTL_COORDINATOR_GANG_RUNNER_H_
#define TRAINCTL_COORDINATOR_GANG_RUNNER_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "coordinator/job_manager.h"
#include "coordinator/node_registry.h"
#include "coordinator/scheduler.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl {

struct GangRunnerOptions {
  // After a coordinator start, how long placed jobs wait for their workers to report their tasks.
  absl::Duration recovery_grace = absl::Seconds(20);
  // A launched task whose worker has not confirmed it (RUNNING or FAILED) by then fails.
  absl::Duration launch_timeout = absl::Minutes(2);
  // Optional, not owned: gets trainctl_scheduler_pass_duration_seconds and
  // trainctl_scheduler_queue_depth.
  metrics::Registry* metrics = nullptr;
};

class GangRunner {
 public:
  // Does not take ownership; all three must outlive the runner. It reads the nodes and their
  // sessions from `nodes` and keeps each node's `tasks` and `draining` there.
  GangRunner(JobManager* jobs, Clock* clock, NodeRegistry* nodes, GangRunnerOptions options);
  ~GangRunner();
  GangRunner(const GangRunner&) = delete;
  GangRunner& operator=(const GangRunner&) = delete;

  // Loads waiting (pending, restarting) and placed (scheduled, running) jobs from the store; the
  // placed ones wait `recovery_grace` for their workers.
  absl::Status Recover();

  // A job was submitted, cancelled, or changed in the store: queue it, forget it, or stop its run.
  void JobChanged(const std::string& job_id);

  // Launch deadlines, recovery deadlines, ends and placements the store could not take.
  void Tick();
  // A scheduling pass, when something changed since the last one (a job, a node, freed slots).
  void ScheduleIfNeeded();
  // Something that may let a waiting job start (a node registered).
  void NeedSchedule() { schedule_needed_ = true; }

  // What the workers report (gang_runner_reports.cc) -------------------------------------------

  // OK when `node` may speak for everything `message` concerns: a task status or a warning naming
  // a task must be about one of the node's tasks, a log line or trainer event about a rank of the
  // job's current run on that node (and, for an event, of its current attempt), a warning naming a
  // job about a job running there. Else PERMISSION_DENIED naming the task, job or rank.
  absl::Status MaySpeakFor(const WorkerNode& node, const trainctl::v1::WorkerMessage& message);

  // A task status from `node` (checked: MaySpeakFor). Returns a transient store error
  // (IsTransientStoreError) when its effects could not be stored: it must not be acknowledged.
  absl::Status TaskStatus(WorkerNode& node, const trainctl::v1::TaskStatus& status);

  // A registering worker's tasks against those this coordinator expects on `node`: adopted (a
  // recovering run placed it there), stopped (another node's, or one no longer run), or left
  // running; tasks the node should hold that it did not report fail. Returns how many reports
  // named another node's task (rejected: the node may not speak for them).
  int Reconcile(WorkerNode& node, const trainctl::v1::RegisterWorker& reg);

  // A task of `node` ended without a status the coordinator could use: fail it and its run.
  void FailTaskOf(WorkerNode& node, const std::string& task_id, const std::string& why);

  // `node` was lost (its lease ran out): its tasks fail with `reason`.
  void NodeLost(WorkerNode& node, const std::string& reason);

  // Views --------------------------------------------------------------------------------------

  // Slots of the node taken by its tasks and by tasks still stopping there.
  int UsedSlots(const WorkerNode& node) const;
  // The node's tasks, as ListNodes shows them.
  std::vector<trainctl::v1::NodeTask> TasksOn(const WorkerNode& node) const;
  int placed_jobs() const { return static_cast<int>(runs_.size()); }
  int waiting_jobs() const { return static_cast<int>(waiting_.size()); }

 private:
  struct Task {
    std::string id;
    std::string job_id;
    std::string node;
    int attempt = 0;
    int node_rank = 0;
    int slots = 0;
    trainctl::v1::TaskState state = trainctl::v1::TASK_STATE_STARTING;
    bool launched = false;
    absl::Time launched_at;
  };
  struct Run {  // a placed job
    Job job;
    std::vector<std::string> task_ids;  // by node rank
    std::vector<std::string> nodes;     // by node rank; empty for a job placed by an older version
    std::string master_addr;
    int master_port = 0;
    bool failing = false;
    std::string failure;
    // The first failed task's failed rank, its exit code (-1: a signal) and last log line, for
    // the remedies (coordinator/remedy_ladder.h); exit code 0 when the run failed otherwise.
    int failed_rank = -1;
    int failed_exit_code = 0;
    std::string failed_detail;
    bool cancel_requested = false;
    absl::Time recover_until = absl::InfinitePast();  // > now: waiting for workers to report
    absl::Status finish_error;  // not OK: every task ended, but storing the job's end failed
  };
  struct Metrics;

  void Enqueue(const Job& job);
  void SchedulePass();
  void Place(const std::string& job_id, const std::vector<std::string>& nodes);
  void LaunchTask(Run& run, Task& task);
  void SendCancel(const Task& task, const std::string& reason);
  // Tells `node` to stop a task the coordinator does not run there; its `slots` (0: none known)
  // count as used until the worker reports it ended.
  void StopStale(WorkerNode& node, const std::string& task_id, int slots,
                 const std::string& reason);
  // Marks the run failing (first reason wins) and stops its live tasks.
  void FailRun(Run& run, const std::string& reason);
  void CancelRun(Run& run, const std::string& reason);
  // Asks the workers to stop the run's live tasks; tasks never launched end at once.
  void StopTasks(Run& run, const std::string& reason);
  void EndTask(Task& task, trainctl::v1::TaskState state);
  // Ends the run when every task has ended. When the store cannot take the end the run stays, with
  // finish_error set, and Tick tries again.
  void MaybeFinish(std::string job_id);  // by value: it erases the run that may own the id
  // MaybeFinish, then the run's finish_error (OK once the run has ended or while tasks run).
  absl::Status FinishRun(std::string job_id);  // by value, as MaybeFinish
  // Moves a scheduled job to running (a no-op in any other state), so that its end is a legal
  // transition whatever order its tasks' reports came in (a task may end before its worker ever
  // reported it running). Returns a transient store error; other errors are logged.
  absl::Status MarkRunning(Run& run, const std::string& reason);
  // A recovering run stops waiting for its workers: node ranks nobody reported count as failed
  // (with `reason`, or a default naming them), then the run ends as its tasks allow.
  void EndRecovery(const std::string& job_id, const std::string& reason);
  // Reconcile's two halves: one task the worker reports; the tasks it did not report.
  // ReconcileReported returns false when the report named another node's task.
  bool ReconcileReported(WorkerNode& node, const trainctl::v1::RunningTask& rt);
  void EndTasksGoneFrom(WorkerNode& node, const std::set<std::string>& reported);
  // Whether the run placed node rank(s) on `node`; sets the global ranks they run, [first, last).
  bool RanksOn(const Run& run, const std::string& node, int* first, int* last) const;
  // The job as stored now (checkpoints recorded since its placement), else `placed`.
  Job Stored(const Job& placed);
  // The smallest GPU memory of the nodes the job was placed on; nullopt when one is a CPU node or
  // no longer known.
  std::optional<int64_t> GpuBytesOf(const Job& placed);
  Task* FindTask(const std::string& id);

  JobManager* const jobs_;
  Clock* const clock_;
  NodeRegistry* const nodes_;
  const GangRunnerOptions options_;
  const std::unique_ptr<Metrics> metrics_;  // null without options_.metrics

  std::map<std::string, Task> tasks_;
  std::map<std::string, Run> runs_;
  std::map<std::string, SchedJob> waiting_;
  std::set<std::string> told_never_fits_;  // waiting jobs whose message says why they cannot start
  bool schedule_needed_ = false;
  bool place_retry_ = false;  // a placement failed on a transient store error
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_GANG_RUNNER_H_
