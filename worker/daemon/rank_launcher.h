// Starts, watches and stops the local ranks of one task — a gang — on a worker node: one child
// process per rank, its output logged and streamed, its events (lines written to
// $TRAINCTL_EVENT_FD) streamed, and the whole gang stopped as soon as one rank fails (fail fast,
// like torchrun). Each rank leads a session and process group of its own, so a signal to the
// group also reaches whatever the rank started.
//
// Process lifetime rules this module keeps:
//  - Ranks never outlive the daemon: each child sets PR_SET_PDEATHSIG(SIGKILL). That signal fires
//    when the *thread* that forked the child exits, not the process, so every rank of every gang
//    is forked by one process-lifetime "spawner" thread (started on first use, never exits;
//    Gang::Start hands it the work and waits). A process forked from the daemon without exec that
//    starts gangs gets its own spawner thread.
//  - No orphans: when a rank's main process exits, whatever is left in its process group gets
//    SIGTERM, then SIGKILL after kill_grace; on_exit is called only when every group is empty.
//    A descendant that leaves the group (setsid/setpgid) escapes this.
//  - No zombies: only the gang's own pids are waited for (never waitpid(-1): other code in the
//    process forks too). Descendants orphaned by a rank are reparented to init — or to this
//    process if it is a child subreaper (prctl(PR_SET_CHILD_SUBREAPER)), which the daemon should
//    be where pid 1 does not reap (many containers); then the gang reaps the members of its own
//    process groups (waitid(P_PGID)). Members that are zombies of another parent count as gone.
//    A rank reaped by someone else (SIGCHLD set to SIG_IGN, a waitpid(-1) elsewhere) is reported
//    as failed with exit_code -1 and signal 0.
//  - In the child between fork and exec only async-signal-safe calls are made (rank_child.h); it
//  gets
//    /dev/null as stdin, pipes as stdout, stderr and fd 3 (the event fd), no other inherited fd,
//    an empty signal mask and default dispositions (the daemon blocks SIGINT/SIGTERM for sigwait
//    and ignores SIGPIPE; ranks must not inherit that).
#ifndef TRAINCTL_WORKER_DAEMON_RANK_LAUNCHER_H_
#define TRAINCTL_WORKER_DAEMON_RANK_LAUNCHER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl::worker {

// The fd on which a rank finds the write end of its event pipe; also in $TRAINCTL_EVENT_FD.
inline constexpr int kRankEventFd = 3;
// Lines longer than this (stdout, stderr, events) are delivered in pieces of at most this size, cut
// between UTF-8 characters where the line is well-formed. Lines are delivered as the rank wrote
// them, ill-formed bytes included: making them UTF-8 is the receiver's business.
inline constexpr size_t kMaxRankLineBytes = 64 * 1024;
// How many of a rank's last stdout/stderr lines RankExit::last_lines keeps.
inline constexpr size_t kRankTailLines = 20;

// Another user a rank runs as (the worker's --rank_user): set in the child before exec, so the
// rank cannot read what only the daemon's user can (its token file, its TLS key).
struct RankUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (initgroups' list for the user)
  std::string home;           // the rank's $HOME
};

struct RankSpec {
  int rank = 0;                            // global rank (for reporting)
  std::vector<std::string> argv;           // argv[0] is an absolute path, exec'd directly
  std::map<std::string, std::string> env;  // added to (and overriding) the daemon's environment
  std::string log_path;  // stdout+stderr lines are appended here (dirs created); "" = no log file
  // > 0: the log file grows to at most this many bytes (of this run), then says so in one last
  // line and keeps nothing more; the lines still reach on_log.
  int64_t max_log_bytes = 0;
  std::string cwd;               // "" = inherit
  std::optional<RankUser> user;  // none: the daemon's own user
};

struct RankExit {
  int rank = -1;
  int exit_code = -1;  // -1 when killed by a signal (or when its status was lost: see above)
  int signal = 0;
  std::vector<std::string> last_lines;  // its last kRankTailLines lines of stdout and stderr
};

struct GangResult {
  bool succeeded = false;                 // every rank exited 0 and the gang was not cancelled
  bool cancelled = false;                 // Cancel() took effect before any rank failed
  std::optional<RankExit> first_failure;  // the rank that failed first (the fail-fast cause)
  std::vector<RankExit> exits;            // every rank's exit, in the order given to Start
};

// One running gang. Thread-safe. Callbacks are called on the gang's own supervisor thread, one at
// a time, never with a lock of this class held; they may call Cancel(), pids() and done(), but
// must not destroy the Gang (~Gang joins that thread) nor Wait() for it, and should return quickly
// (the same thread reads every rank's pipes and enforces kill_grace).
class Gang {
 public:
  struct Callbacks {
    // Each line of a rank's stdout or stderr (`stream` is "stdout" or "stderr"), without its
    // newline; also a final line without one at EOF. Written to the rank's log_path first.
    std::function<void(int rank, const std::string& stream, std::string line)> on_log;
    // Each line the rank writes to $TRAINCTL_EVENT_FD.
    std::function<void(int rank, std::string line)> on_event;
    // Exactly once, after every rank has been reaped, every group is empty and every pipe is
    // drained (all on_log/on_event calls come before it) — unless the Gang is destroyed first.
    std::function<void(const GangResult&)> on_exit;
  };

  // Forks and execs every rank (on the spawner thread) and starts supervising them. Returns once
  // every rank has exec'd. Errors: INVALID_ARGUMENT for no ranks, an empty argv or a relative
  // argv[0]; the errno-derived code (NOT_FOUND, PERMISSION_DENIED, ...) with the path and errno
  // text when a log file cannot be opened or a rank cannot be exec'd (or chdir'd, or switched to
  // its user: PERMISSION_DENIED when the daemon lacks the privilege); then no rank
  // is left running and no callback is called. Any callback may be empty.
  static absl::StatusOr<std::unique_ptr<Gang>> Start(std::vector<RankSpec> ranks,
                                                     Callbacks callbacks,
                                                     absl::Duration kill_grace);

  // If ranks are still running: SIGKILLs their process groups, reaps them and waits until the
  // groups are empty; on_exit is then not called. No callback runs after it returns.
  ~Gang();
  Gang(const Gang&) = delete;
  Gang& operator=(const Gang&) = delete;

  // Asynchronous: SIGTERM to every rank's process group, SIGKILL after kill_grace; on_exit
  // follows with cancelled = true unless a rank had failed first. A no-op once every rank's main
  // process has exited, and when called again.
  void Cancel();

  // The ranks' pids (= their process group ids), in the order given to Start.
  std::vector<pid_t> pids() const { return pids_; }

  // True once every rank is reaped, every group empty and on_exit (if any) has returned.
  bool done() const;

  // Blocks until done() or `timeout` passes; returns done().
  bool Wait(absl::Duration timeout) const;

 private:
  class Supervisor;  // the gang's state and its supervisor thread's loop (rank_launcher.cc)

  Gang(std::vector<pid_t> pids, std::unique_ptr<Supervisor> supervisor);

  const std::vector<pid_t> pids_;
  const std::unique_ptr<Supervisor> supervisor_;
  std::thread thread_;  // runs supervisor_->Run(); joined by ~Gang
};

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_RANK_LAUNCHER_H_
