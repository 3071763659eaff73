// Worker: the daemon's core. Keeps one WorkerService.Session stream to the coordinator that
// leads (coordinator_link.h: each attempt tries the next address, with back-off between rounds
// through the list), launches the ranks of the tasks it is given (rank_launcher.h), and
// reports their status, log lines and trainer events through the Outbox, so nothing is lost while
// the coordinator is away.
//
// Ranks never outlive the daemon (they die with it: PR_SET_PDEATHSIG), so a node whose worker is
// gone holds no GPU. A coordinator restart does not touch them: on reconnect the worker reports
// every task it holds and the coordinator adopts them.
#ifndef TRAINCTL_WORKER_DAEMON_WORKER_H_
#define TRAINCTL_WORKER_DAEMON_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rank_env.h"
#include "trainctl/v1/worker.grpc.pb.h"
#include "worker/daemon/coordinator_link.h"
#include "worker/daemon/log_rate.h"
#include "worker/daemon/outbox.h"
#include "worker/daemon/output_roots.h"
#include "worker/daemon/rank_launcher.h"
#include "worker/daemon/worker_stats.h"

namespace trainctl::worker {

// What the worker's loop reports on each pass (WorkerOptions::on_loop).
struct WorkerLoopSummary {
  bool registered = false;  // the coordinator accepted the live session
  int tasks = 0;            // tasks held (starting, running, or ended and not yet acknowledged)
  std::string coordinator;  // the address of the live session, else of the attempt last made
};

struct WorkerOptions {
  // The coordinators' gRPC targets (common/client_config.h CoordinatorTargets): one, or an active
  // coordinator and its standbys in any order. Never empty.
  std::vector<std::string> coordinators = {"127.0.0.1:50051"};
  // How the session reaches the coordinator (common/credentials.h); null: plaintext. With
  // client certificates, node_name must be the certificate's CN or one of its DNS names.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string token;  // sent as `authorization: Bearer <token>`; empty: none
  // When set, read again before every session (common/access_tokens.h ReadTokenFile), so a
  // rotated token is used from the next reconnect without a restart; a read that fails keeps the
  // token last read (or `token`), and says so in the log.
  std::string token_file;
  std::string node_name;
  std::string
      advertise_addr;    // what other nodes' ranks dial (MASTER_ADDR when this node is rank 0)
  std::string work_dir;  // tasks/<task>/{launch.json,rank-<r>.log}, the outbox spill file
  std::map<std::string, std::string> labels;
  std::vector<trainctl::v1::GpuInfo> gpus;  // empty: a CPU node with cpu_slots slots
  int cpu_slots = 1;
  std::string trainer_bin;  // what each rank runs: `<trainer_bin> train --launch LAUNCH`
  // Which variables a job's env may set in its ranks (common/rank_env.h); a launch whose env sets
  // another fails, naming it. The coordinator checks this at submit; the worker checks again.
  RankEnvPolicy rank_env;
  // The user ranks run as (--rank_user); none: the daemon's own, which can read its credentials.
  // The job's output_dir is created for that user (rank_user.h).
  std::optional<RankUser> rank_user;
  // Absolute directories a job may write under (its output_dir and its stages'); a launch whose
  // paths resolve (symlinks and "..", relative to this process's working directory) elsewhere
  // fails. Empty: work_dir.
  std::vector<std::string> output_roots;
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration kill_grace = absl::Seconds(10);
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(5);
  // An address that neither connects nor refuses within this long gives its turn to the next.
  absl::Duration connect_timeout = absl::Seconds(2);
  absl::Duration log_flush_interval = absl::Milliseconds(100);
  // Each rank's output is forwarded to the coordinator at this many bytes per second at most,
  // after a burst of rank_log_burst_bytes (log_rate.h; <= 0: no limit). Lines over it stay in the
  // rank's log file only; the rank's stream then says how many, and the job gets one warning.
  double rank_log_rate_bytes = 1 << 20;
  double rank_log_burst_bytes = 8 << 20;
  // Each rank's log file (tasks/<task>/rank-<r>.log) keeps at most this many bytes; <= 0: all.
  int64_t max_rank_log_bytes = int64_t{4} << 30;
  size_t outbox_memory_bytes = size_t{64} << 20;
  // Optional: runs on Run()'s thread on every pass of its loops (every 100 ms at most while a
  // session is open, every 20 ms while waiting to reconnect; an attempt to connect may hold it up
  // for connect_timeout), so it stops when that loop hangs (the daemon's watchdog pings from here:
  // common/service_loop_reporter.h). Must not call back into the worker.
  std::function<void(const WorkerLoopSummary&)> on_loop;
  // Probes the node's topology (topology_probe.h): once when Run starts (the result goes with every
  // register), and again, off the session's threads, each time the coordinator sends
  // ProbeTopology. Null: no topology is sent.
  std::function<trainctl::v1::NodeTopology()> probe_topology;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until Stop(): connects, reconnects, runs tasks.
  void Run();
  // Any thread: stops every rank (SIGTERM, SIGKILL after kill_grace), gives the coordinator a
  // moment to take their final status, and makes Run return.
  void Stop();

  // A snapshot of the session, outbox, tasks and rank processes, for /metrics. Any thread.
  WorkerStats Stats();

 private:
  struct Task {
    trainctl::v1::LaunchTask launch;
    std::shared_ptr<Gang> gang;
    trainctl::v1::TaskState state = trainctl::v1::TASK_STATE_STARTING;
    int master_port = 0;
    std::vector<int> gpus;  // indices given to this task
    int cpu_slots = 0;      // CPU slots given to this task
    int64_t final_seq = 0;  // seq of its terminal status; dropped once acknowledged
    std::string cancel_reason;
  };

  using SessionStream =
      grpc::ClientReaderWriter<trainctl::v1::WorkerMessage, trainctl::v1::CoordinatorMessage>;

  // One attempt at the next coordinator in turn, until the session breaks or Stop. Returns whether
  // the coordinator accepted the session.
  bool Session();
  // The session's reader thread: handles what the coordinator sends until the stream ends, then
  // sets `broken`; sets `registered` (and counts the session) when the coordinator accepts it.
  void ReadSession(SessionStream* stream, std::atomic<bool>* broken, std::atomic<bool>* registered);
  // Sends what the outbox holds past the last acknowledgement, then new messages and heartbeats,
  // until `broken` or closing_. Returns the seq of the last message written.
  int64_t WriteSession(SessionStream* stream, std::atomic<bool>* broken);
  // After a session ended without Stop: logs why and, unless the coordinator only went away, counts
  // a strike against the oldest message sent (`sent` through) and not acknowledged.
  void OnSessionEnded(const grpc::Status& status, int64_t sent, bool registered);
  trainctl::v1::WorkerMessage MakeRegister();
  void Handle(const trainctl::v1::CoordinatorMessage& message);
  void HandleLaunch(const trainctl::v1::LaunchTask& launch);
  // Marks `task` failed with `why` (logged, and its final status queued for the coordinator).
  void FailLaunchLocked(Task& task, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What this worker checks in a launch before giving it resources (output roots, the env policy),
  // and the job's output_dir made for options_.rank_user. The error's message says why.
  absl::Status CheckLaunch(const trainctl::v1::LaunchTask& launch);
  // Gives `task` `slots` free GPUs (or CPU slots on a CPU node); an error when too few are free.
  absl::Status ReserveSlotsLocked(Task& task, int slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The launch's local ranks: the trainer's argv, the job's env under the launch contract (rank
  // env), and each rank's log file in `dir`.
  std::vector<RankSpec> MakeRankSpecs(const Task& task, int slots, const std::filesystem::path& dir,
                                      const std::filesystem::path& launch_path, int port) const;
  // Routes a gang's log lines, trainer events and exit into the worker.
  Gang::Callbacks MakeGangCallbacks(const trainctl::v1::LaunchTask& launch);
  // Starts the launch's ranks (with mu_ released meanwhile) and reports its task running, or
  // failed.
  void StartRanksLocked(const trainctl::v1::LaunchTask& launch, std::vector<RankSpec> ranks,
                        int slots, int port) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCancel(const trainctl::v1::CancelTask& cancel);
  void HandleAck(int64_t through_seq);
  // Takes message `seq` out of the outbox for good (the coordinator cannot take it), keeps its
  // bytes in <work_dir>/set-aside/, and reports a WorkerWarning for each job it concerned.
  void SetAside(int64_t seq, const std::string& reason);
  // After a session ended: counts the sessions in a row that ended while the oldest unacknowledged
  // message had been sent and the coordinator had accepted the register; at kPoisonSessions that
  // message is set aside (the coordinator cannot parse it, or dies on it).
  void CountStrike(int64_t sent_through, bool registered, const std::string& why);
  void OnLog(const std::string& job_id, int rank, const std::string& stream, std::string line);
  void OnExit(const std::string& task_id, const GangResult& result);
  // Queues `log` for the coordinator (flushing a full batch first).
  void AppendLogLocked(trainctl::v1::LogLine log) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // If the rank held lines back since it last said so: a line of its own saying how many, and
  // the job's one warning. `ended`: the rank's limiter is dropped after.
  void ReportHeldBackLocked(const std::string& job_id, int rank, bool ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushStatus(const Task& task, trainctl::v1::TaskStatus status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLogsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLoop();
  // Runs the probes the coordinator asked for (ProbeTopology), one at a time, until closing_.
  void ProbeLoop();
  bool stopping() const { return stopping_.load(); }
  void ReportLoopPass();  // options_.on_loop

  const WorkerOptions options_;
  const OutputRoots output_roots_;
  const std::string boot_id_;
  Outbox outbox_;
  CoordinatorLink link_;     // Run()'s thread only
  std::string coordinator_;  // Run()'s thread only: the address of the attempt under way or last

  absl::Mutex mu_;
  std::map<std::string, Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::set<int> free_gpus_ ABSL_GUARDED_BY(mu_);
  int free_cpu_slots_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<trainctl::v1::LogLine> logs_ ABSL_GUARDED_BY(mu_);
  size_t logs_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // text bytes in logs_
  // What each rank of a running task (by job id and rank) may still forward (options_'s rate).
  struct RankForwarding {
    LogRateLimiter limiter;
    bool warned = false;  // the job has heard that lines are held back
  };
  std::map<std::pair<std::string, int>, RankForwarding> forwarding_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the live session
  // The latest topology probe, sent with every register; a probe asked for and not yet run.
  trainctl::v1::NodeTopology topology_ ABSL_GUARDED_BY(mu_);
  bool probe_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopping_{false};  // Stop() began: no new tasks
  std::atomic<bool> closing_{false};   // Stop() is done with the ranks: end the session
  // For Stats(): the coordinator accepted the live session; how many sessions it accepted.
  std::atomic<bool> connected_{false};
  std::atomic<int64_t> sessions_registered_{0};
  // Run()'s thread only (CountStrike): the oldest unacknowledged seq when the last session ended,
  // and how many sessions in a row ended with it so.
  int64_t strike_seq_ = 0;
  int strikes_ = 0;
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_WORKER_H_
