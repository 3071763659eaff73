// How one rank's process is made, for rank_launcher.cc: the plan prepared in the daemon (argv, the
// environment, the fds, the user to run as), what the child does between fork and exec, and the one
// thread that forks every rank (see rank_launcher.h for why). Not an API of its own.
#ifndef TRAINCTL_WORKER_DAEMON_RANK_CHILD_H_
#define TRAINCTL_WORKER_DAEMON_RANK_CHILD_H_

#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/daemon/rank_launcher.h"

namespace trainctl::worker::internal {

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// The child's fds 0..4: stdin, stdout, stderr, the event fd, and the exec-failure report (CLOEXEC,
// so that a successful exec closes it). Everything from kFirstClosedFd up is closed.
inline constexpr int kReportFd = 4;
inline constexpr int kChildFds = 5;
inline constexpr int kFirstClosedFd = 5;
static_assert(kRankEventFd == 3, "the child fd layout above");

// Runs `work` on this process's spawner thread (started on first use; every signal blocked in it)
// and returns once it has run. A process forked without exec from one that had a spawner gets its
// own.
void RunOnSpawner(const std::function<void()>& work);

// Everything the child needs, prepared before fork: between fork and exec it makes only
// async-signal-safe calls.
struct ChildPlan {
  std::vector<std::string> argv_strings;
  std::vector<std::string> env_strings;
  std::vector<char*> argv;  // into argv_strings, null-terminated
  std::vector<char*> envp;  // into env_strings, null-terminated
  std::string cwd;
  std::optional<RankUser> user;               // switched to before exec; none: the daemon's
  int fds[kChildFds] = {-1, -1, -1, -1, -1};  // become the child's fds 0..4
};

enum ChildStep : int { kSetsid = 1, kDeathSignal, kMoveFds, kChdir, kExec, kSetUser };

// What the child writes to the report pipe when it cannot exec.
struct ChildFailure {
  int step = 0;
  int error = 0;
};

// In the child: its own session, the user (groups, gid, uid, in that order, before
// PR_SET_PDEATHSIG, which a credential change clears), the fds, the directory, default signals,
// then exec. On failure it writes a ChildFailure to its report fd and exits 127.
[[noreturn]] void RunChild(const ChildPlan& plan, pid_t parent, int max_fd);

// The bound of the fd-closing loop where close_range is missing.
int MaxFd();

// The rank's environment as NAME=value: the daemon's own (the operator's, LD_* included), without
// what is the daemon's alone (NOTIFY_SOCKET, TRAINCTL_TOKEN), then `extra` (already checked by the
// caller), then TRAINCTL_EVENT_FD; with a user, its HOME, USER and LOGNAME.
std::vector<std::string> RankEnvironment(const std::map<std::string, std::string>& extra,
                                         const std::optional<RankUser>& user);

// A pipe whose ends are both CLOEXEC (the child dup2s its end onto a fixed fd).
absl::Status MakePipe(ScopedFd* read_end, ScopedFd* write_end);

// Reads until `size` bytes, EOF or an error; returns how many it got.
size_t ReadFully(int fd, void* data, size_t size);

// A pidfd for `pid` (CLOEXEC), -1 where the kernel has none.
int PidfdOpen(pid_t pid);

// What failed, for the error of Gang::Start: "exec /bin/x for rank 3".
std::string DescribeChildStep(int step, const RankSpec& spec);

}  // namespace trainctl::worker::internal

#endif  // TRAINCTL_WORKER_DAEMON_RANK_CHILD_H_
