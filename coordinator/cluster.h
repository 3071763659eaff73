// Cluster: the coordinator's view of its worker nodes and of the tasks running on them, and the
// loop that places waiting jobs (scheduler.h), launches their ranks, follows them to the end and
// recovers from faults.
//
// A placed job runs as one task per node: task `n` runs ranks [n*M, (n+1)*M) of an N x M gang.
// Node rank 0 is launched first; its worker picks the rendezvous port and reports it, and only
// then are the other nodes launched with MASTER_ADDR/MASTER_PORT pointing at it.
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
//   the spec those remedies make (ApplyRemedies), its DeepSpeed config resolved again.
// - A node that sends nothing for `lease_timeout` is lost: its tasks count as failed. Silence is
//   timed from when its messages arrive, not from when the loop handles them (NodeRegistry).
// - A worker message whose effects cannot be stored (a full disk) is not acknowledged: the session
//   is closed, and the worker sends it again, with everything after it, when it reconnects. A job
//   end that cannot be stored is retried every tick. So nothing reported is lost, and a job ends
//   as its ranks did once the store takes writes again.
// - A worker that reconnects reports the tasks it still holds; they are adopted, not failed. A
//   restarted coordinator reloads placed jobs from the store and waits `recovery_grace` for their
//   workers to report them before counting the missing tasks as failed.
//
// Distrust: every worker message is checked (common/worker_limits.h) before it touches any state,
// and a node speaks only for what this coordinator placed on it (CheckSender): a task status or a
// warning naming a task must be about one of the node's tasks, a log line or trainer event about a
// rank of the job's current run on that node (and, for an event, of its current attempt), a
// warning naming a job about a job running there. Anything else is rejected by seq, counted in
// trainctl_worker_messages_rejected_total{reason="not_placed_here"}, and changes no job; a
// register may adopt only the tasks the run placed on that node.
// A bad register ends its stream with INVALID_ARGUMENT; a register under the name of a node whose
// session is live (open and heard from within the lease) ends with ALREADY_EXISTS unless it comes
// from the same worker process (boot_id), which is reconnecting; after the lease a newcomer takes
// the name over and the old stream is ended saying so. Any other bad message is rejected by seq
// (the worker sets it aside) and acknowledged, so it never blocks what follows.
//
// Pieces: NodeRegistry (node_registry.h) keeps the nodes, their sessions and their leases;
// EventIngester (event_ingester.h) stores log batches and trainer events in batches on its own
// thread; Cluster itself is the gang runner (placement, launch, restarts, recovery) and routes
// worker messages between them.
//
// Delivery: a worker message is acknowledged only once its effects are stored, and an Ack covers a
// seq only when everything the worker sent up to it is (internal/ack_window.h): log batches and
// trainer events are handed to the ingester and acknowledged when it reports them stored; a task
// status or warning, which the loop applies itself, waits (parked, its stream held) until what the
// same worker sent before it is stored, so a job never ends before its last lines are kept. A
// message handed on counts as applied (applied_seq), so one sent again meanwhile is not applied
// twice; when the ingester reports a transient store error, applied_seq goes back to before the
// message and the session is closed, so the worker sends it again with everything after it.
//
// Threading: every state change runs on one loop thread (an actor); the public methods enqueue work
// and return. ListNodes waits for a snapshot from the loop. Store writes of worker reports run on
// the ingester's thread; the loop writes only job state changes (placement, start, end).
#ifndef TRAINCTL_COORDINATOR_CLUSTER_H_
#define TRAINCTL_COORDINATOR_CLUSTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "coordinator/event_ingester.h"
#include "coordinator/job_manager.h"
#include "coordinator/node_registry.h"
#include "coordinator/scheduler.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl {

// What the loop reports after each tick (ClusterOptions::on_tick).
struct ClusterSummary {
  int nodes = 0;         // registered and not lost
  int placed_jobs = 0;   // scheduled or running
  int waiting_jobs = 0;  // pending or restarting
};

struct ClusterOptions {
  // A node that sent nothing (heartbeats included) for this long is lost.
  absl::Duration lease_timeout = absl::Seconds(10);
  // After a coordinator start, how long placed jobs wait for their workers to report their tasks.
  // Zero: lease_timeout + 10 s (a worker's reconnect back-off is at most 5 s by default).
  absl::Duration recovery_grace = absl::ZeroDuration();
  // A launched task whose worker has not confirmed it (RUNNING or FAILED) by then fails.
  absl::Duration launch_timeout = absl::Minutes(2);
  // How often the loop checks leases and recovery deadlines.
  absl::Duration tick = absl::Milliseconds(200);
  // The event ingester's queue and batches (its `metrics` is set from the field below).
  EventIngesterOptions ingest;
  // Optional, not owned (nullptr: no metrics); must outlive the cluster. Gets the families
  // trainctl_scheduler_pass_duration_seconds, trainctl_scheduler_queue_depth,
  // trainctl_node_lease_misses_total and the ingester's (event_ingester.h).
  metrics::Registry* metrics = nullptr;
  // Optional: runs on the loop thread after every tick, so it stops when the loop hangs (the
  // daemon's watchdog pings from here: common/service_loop_reporter.h). Must not call back into
  // the cluster.
  std::function<void(const ClusterSummary&)> on_tick;
};

class Cluster : public JobObserver {
 public:
  // Does not take ownership; `jobs` and `clock` must outlive the cluster. Observes `jobs` from
  // construction to destruction: a submit or an accepted cancel wakes the scheduler.
  Cluster(JobManager* jobs, Clock* clock, ClusterOptions options);
  ~Cluster() override;  // Stop(), then stops observing
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Loads waiting (pending, restarting) and placed (scheduled, running) jobs from the store, then
  // starts the loop. Placed jobs wait for their workers (recovery_grace).
  absl::Status Start();
  void Stop();

  // A worker stream opened. Returns the session id to pass to Receive/Disconnect.
  int64_t Connect(std::shared_ptr<WorkerChannel> channel);
  // A message from that stream (called on the stream's thread, which stamps its arrival for the
  // lease and runs its checks). `done` runs once the message has been handled, or handed to the
  // ingester while its queue has room (the stream reads the next one then: per-worker flow
  // control).
  void Receive(int64_t session, trainctl::v1::WorkerMessage message, std::function<void()> done);
  // The stream ended. The node stays placeable-for-reconnect until its lease expires.
  void Disconnect(int64_t session);

  // A job was submitted or cancelled.
  void JobChanged(const std::string& job_id);
  void OnSubmitted(const Job& job) override { JobChanged(job.id()); }
  void OnCancelAccepted(const Job& job) override { JobChanged(job.id()); }

  // A snapshot of the nodes, sorted by name.
  std::vector<trainctl::v1::Node> ListNodes();

  // Asks `node`'s worker for a fresh topology probe (ProbeTopology) and waits until a probe of that
  // node is stored (JobStore::PutNodeTopology) or `timeout` passes. NOT_FOUND for a node never
  // registered, FAILED_PRECONDITION when its worker is not connected, DEADLINE_EXCEEDED when no
  // probe was stored in time. Any thread but the loop's (cluster_sessions.cc).
  absl::Status RefreshTopology(const std::string& node, absl::Duration timeout);

  // Runs everything enqueued so far, and stores what was handed to the ingester (tests).
  void Flush();

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

  void Post(std::function<void()> work);
  void Loop();
  ClusterSummary Summary();  // loop thread

  // Loop-thread handlers of worker messages (cluster_sessions.cc). HandleMessage takes the
  // message with its checks (CheckWorkerMessage, run on the stream's thread) and its arrival time,
  // and runs `done` once the stream may read on.
  void HandleMessage(int64_t session, trainctl::v1::WorkerMessage message, absl::Status checked,
                     absl::Time arrived, std::function<void()> done);
  void HandleRegister(int64_t session, const trainctl::v1::RegisterWorker& reg);
  // Register's reconciling, one task the worker reports: adopted (a recovering run placed it on
  // this node), stopped (another node's, or one the coordinator no longer runs), or left running.
  void ReconcileReported(WorkerNode& node, const trainctl::v1::RunningTask& rt);
  // Register's reconciling, the tasks the node should hold and its worker did not report (it
  // restarted): they fail, and recovering runs stop waiting for them.
  void EndTasksGoneFrom(WorkerNode& node, const std::set<std::string>& reported);
  // A task status or warning whose turn came: applies it, then acknowledges it, or leaves it for a
  // resend (RetryLater) when its effects could not be stored.
  void ApplyOnLoop(WorkerNode& node, int64_t session, const trainctl::v1::WorkerMessage& message);
  // The ingester's report: acknowledges what is stored, leaves the rest for a resend, and applies
  // a parked message whose turn came.
  void HandleStored(const std::vector<EventIngester::Outcome>& outcomes);
  // A topology probe of `node` was stored: wakes RefreshTopology.
  void TopologyStored(const std::string& node);
  // Sends the Ack that the node's finished messages allow.
  void SendAcks(WorkerNode& node);
  // Returns a transient store error (IsTransientStoreError) when the status's effects could not be
  // stored: it must not be acknowledged. Other problems are logged.
  absl::Status HandleTaskStatus(WorkerNode& node, const trainctl::v1::TaskStatus& status);
  // Message `seq` (`what`) and everything after it stay unacknowledged and count as not applied;
  // the node's session is closed, so its worker reconnects and sends them again.
  void RetryLater(WorkerNode& node, int64_t seq, const std::string& what, const absl::Status& why);
  void HandleWarning(WorkerNode& node, const trainctl::v1::WorkerWarning& warning);
  // OK when `node` may speak for everything `message` concerns (see "Distrust" above), else
  // PERMISSION_DENIED naming the task, job or rank it may not report on.
  absl::Status CheckSender(const WorkerNode& node, const trainctl::v1::WorkerMessage& message);
  // Whether the run placed node rank(s) on `node`; sets the global ranks they run, [first, last).
  bool RanksOn(const Run& run, const std::string& node, int* first, int* last) const;
  // Counts a rejected worker message: PERMISSION_DENIED as not_placed_here, else invalid.
  void CountRejected(const absl::Status& why);
  // A sequenced message that failed its checks: Reject, then Ack, so the worker moves on. A bad
  // status of one of the node's live tasks fails that task (its real end is unknowable).
  void RejectMessage(WorkerNode& node, int64_t session, const trainctl::v1::WorkerMessage& message,
                     const absl::Status& why);
  // A task of `node` ended without a status the coordinator could use: fail it and its run.
  void FailTaskOf(WorkerNode& node, const std::string& task_id, const std::string& why);
  // Moves a scheduled job to running (a no-op in any other state), so that its end is a legal
  // transition whatever order its tasks' reports came in (a task may end before its worker ever
  // reported it running). Returns a transient store error; other errors are logged.
  absl::Status MarkRunning(Run& run, const std::string& reason);
  void HandleJobChanged(const std::string& job_id);
  void Tick();
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
  void LoseNode(WorkerNode& node, const std::string& reason);
  // A recovering run stops waiting for its workers: node ranks nobody reported count as failed
  // (with `reason`, or a default naming them), then the run ends as its tasks allow.
  void EndRecovery(const std::string& job_id, const std::string& reason);
  // The job as stored now (checkpoints recorded since its placement), else `placed`.
  Job Stored(const Job& placed);
  Task* FindTask(const std::string& id);
  // Slots of the node taken by its tasks and by tasks still stopping there.
  int UsedSlots(const WorkerNode& node) const;
  void Enqueue(const Job& job);

  struct Metrics;

  JobManager* const jobs_;
  Clock* const clock_;
  const ClusterOptions options_;
  const std::unique_ptr<Metrics> metrics_;  // null without options_.metrics

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_exited_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex late_mu_;  // serialises work run after the loop exited
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread loop_;

  // Loop-thread state (the registry's thread-safe part excepted).
  NodeRegistry registry_;
  std::map<std::string, Task> tasks_;
  std::map<std::string, Run> runs_;
  std::map<std::string, SchedJob> waiting_;
  std::set<std::string> told_never_fits_;  // waiting jobs whose message says why they cannot start
  bool schedule_needed_ = false;
  bool place_retry_ = false;  // a placement failed on a transient store error

  // Topology probes stored, by node (RefreshTopology waits on it).
  absl::Mutex topology_mu_;
  std::map<std::string, int64_t> topologies_stored_ ABSL_GUARDED_BY(topology_mu_);

  // Last: its thread reports to the loop (Post) until it stops.
  std::unique_ptr<EventIngester> ingester_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_CLUSTER_H_
