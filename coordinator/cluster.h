// Cluster: the coordinator's side of the worker sessions, and the loop thread everything about
// nodes and placed jobs runs on. It registers workers (NodeRegistry, node_registry.h), checks and
// routes every message they send, acknowledges what is stored, rejects what is not theirs to say,
// and makes a worker send again what could not be stored. What happens to jobs is GangRunner's
// (gang_runner.h): placement, launch, task ends, restarts, recovery. Logs and trainer events are
// stored by the EventIngester (event_ingester.h) on its own thread.
//
// Leases: a node that sends nothing for `lease_timeout` is lost (GangRunner::NodeLost fails its
// tasks). Silence is timed from when its messages arrive, not from when the loop handles them
// (NodeRegistry).
//
// Distrust: every worker message is checked (common/worker_limits.h) before it touches any state,
// and a node speaks only for what this coordinator placed on it (GangRunner::MaySpeakFor: its own
// tasks, the ranks of the current runs placed on it). Anything else is rejected by seq, counted in
// trainctl_worker_messages_rejected_total{reason="not_placed_here"}, and changes no job; a
// register may adopt only the tasks the run placed on that node.
// A bad register ends its stream with INVALID_ARGUMENT; a register under the name of a node whose
// session is live (open and heard from within the lease) ends with ALREADY_EXISTS unless it comes
// from the same worker process (boot_id), which is reconnecting; after the lease a newcomer takes
// the name over and the old stream is ended saying so. Any other bad message is rejected by seq
// (the worker sets it aside) and acknowledged, so it never blocks what follows.
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
// Threading: every state change runs on one loop thread (an actor), the GangRunner's included; the
// public methods enqueue work and return. ListNodes waits for a snapshot from the loop. Store
// writes of worker reports run on the ingester's thread; the loop writes only job state changes
// (placement, start, end).
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
#include "coordinator/gang_runner.h"
#include "coordinator/job_manager.h"
#include "coordinator/node_registry.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker.pb.h"

namespace trainctl {
namespace internal {
struct ClusterMetrics;  // internal/cluster_metrics.h
}  // namespace internal

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
  void Post(std::function<void()> work);
  void Loop();
  ClusterSummary Summary();  // loop thread

  // Loop-thread handlers of worker messages (cluster_sessions.cc). HandleMessage takes the
  // message with its checks (CheckWorkerMessage, run on the stream's thread) and its arrival time,
  // and runs `done` once the stream may read on.
  void HandleMessage(int64_t session, trainctl::v1::WorkerMessage message, absl::Status checked,
                     absl::Time arrived, std::function<void()> done);
  void HandleRegister(int64_t session, const trainctl::v1::RegisterWorker& reg);
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
  // Message `seq` (`what`) and everything after it stay unacknowledged and count as not applied;
  // the node's session is closed, so its worker reconnects and sends them again.
  void RetryLater(WorkerNode& node, int64_t seq, const std::string& what, const absl::Status& why);
  void HandleWarning(WorkerNode& node, const trainctl::v1::WorkerWarning& warning);
  // Counts a rejected worker message: PERMISSION_DENIED as not_placed_here, else invalid.
  void CountRejected(const absl::Status& why, int count = 1);
  // A sequenced message that failed its checks: Reject, then Ack, so the worker moves on. A bad
  // status of one of the node's live tasks fails that task (its real end is unknowable).
  void RejectMessage(WorkerNode& node, int64_t session, const trainctl::v1::WorkerMessage& message,
                     const absl::Status& why);
  // Leases that ran out: the nodes are lost, their streams closed, their tasks failed.
  void ExpireLeases();

  JobManager* const jobs_;
  Clock* const clock_;
  const ClusterOptions options_;
  const std::unique_ptr<internal::ClusterMetrics> metrics_;  // null without options_.metrics

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_exited_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex late_mu_;  // serialises work run after the loop exited
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread loop_;

  // Loop-thread state (the registry's thread-safe part excepted).
  NodeRegistry registry_;
  GangRunner runner_;

  // Topology probes stored, by node (RefreshTopology waits on it).
  absl::Mutex topology_mu_;
  std::map<std::string, int64_t> topologies_stored_ ABSL_GUARDED_BY(topology_mu_);

  // Last: its thread reports to the loop (Post) until it stops.
  std::unique_ptr<EventIngester> ingester_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COORDINATOR_CLUSTER_H_
