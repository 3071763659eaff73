#include "worker/daemon/rank_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fork_thread.h"
#include "common/rank_env.h"

namespace trainctl::worker::internal {
namespace {

[[noreturn]] void FailChild(int report_fd, ChildStep step) {
  const ChildFailure failure{step, errno};
  if (write(report_fd, &failure, sizeof(failure)) < 0) {
    // Nobody to tell: the parent sees EOF and exit status 127.
  }
  _exit(127);
}

void CloseFrom(int first, int max_fd) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, 0U) == 0) return;
#endif
  for (int fd = first; fd < max_fd; ++fd) close(fd);
}

// Default dispositions (handlers would be reset by exec anyway, SIG_IGN would not) and an empty
// mask: the spawner thread blocks everything and the daemon blocks SIGINT/SIGTERM for sigwait.
void ResetSignals() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);  // EINVAL for glibc's own
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace

[[noreturn]] void RunChild(const ChildPlan& plan, pid_t parent, int max_fd) {
  int report = plan.fds[kReportFd];
  // Its own session and process group, so that a signal to the group reaches all it starts.
  if (setsid() < 0) FailChild(report, kSetsid);
  // Raw system calls: glibc's wrappers would signal the daemon's other threads, which the child
  // does not have. Before PR_SET_PDEATHSIG, which a change of credentials clears.
  if (plan.user.has_value()) {
    const RankUser& user = *plan.user;
    if (syscall(SYS_setgroups, user.groups.size(), user.groups.data()) != 0 ||
        syscall(SYS_setresgid, user.gid, user.gid, user.gid) != 0 ||
        syscall(SYS_setresuid, user.uid, user.uid, user.uid) != 0) {
      FailChild(report, kSetUser);
    }
  }
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) FailChild(report, kDeathSignal);
  if (getppid() != parent) _exit(127);  // the daemon died before prctl; nobody reads the report
  // Every source above the targets first, so that no dup2 overwrites a source still needed.
  int high[kChildFds];
  for (int i = 0; i < kChildFds; ++i) {
    high[i] = fcntl(plan.fds[i], F_DUPFD, kFirstClosedFd);
    if (high[i] < 0) FailChild(report, kMoveFds);
  }
  report = high[kReportFd];
  for (int i = 0; i < kChildFds; ++i) {
    if (dup2(high[i], i) < 0) FailChild(report, kMoveFds);
  }
  report = kReportFd;
  if (fcntl(kReportFd, F_SETFD, FD_CLOEXEC) < 0) FailChild(report, kMoveFds);
  CloseFrom(kFirstClosedFd, max_fd);
  if (!plan.cwd.empty() && chdir(plan.cwd.c_str()) != 0) FailChild(report, kChdir);
  ResetSignals();
  execve(plan.argv[0], plan.argv.data(), plan.envp.data());
  FailChild(report, kExec);
}

int MaxFd() {
  constexpr rlim_t kCap = 1 << 20;  // the close() loop's bound when close_range is missing
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kCap;
  return static_cast<int>(std::min(limit.rlim_cur, kCap));
}

std::vector<std::string> RankEnvironment(const std::map<std::string, std::string>& extra,
                                         const std::optional<RankUser>& user) {
  std::map<std::string, std::string> env = ProcessEnvironment();
  // systemd talks to the daemon, not to its ranks (common/service_notifier.h); the worker's token
  // is its credential, not theirs.
  env.erase("NOTIFY_SOCKET");
  env.erase("TRAINCTL_TOKEN");
  if (user.has_value()) {
    env["HOME"] = user->home;
    env["USER"] = user->name;
    env["LOGNAME"] = user->name;
  }
  for (const auto& [key, value] : extra) env[key] = value;
  env[kRankEventFdVariable] = std::to_string(kRankEventFd);
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(absl::StrCat(key, "=", value));
  return out;
}

absl::Status MakePipe(ScopedFd* read_end, ScopedFd* write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return absl::OkStatus();
}

size_t ReadFully(int fd, void* data, size_t size) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, static_cast<char*>(data) + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));  // CLOEXEC by definition
#else
  (void)pid;
  return -1;
#endif
}

std::string DescribeChildStep(int step, const RankSpec& spec) {
  const std::string rank = absl::StrCat(" for rank ", spec.rank);
  switch (step) {
    case kSetsid:
      return "setsid" + rank;
    case kDeathSignal:
      return "prctl(PR_SET_PDEATHSIG)" + rank;
    case kMoveFds:
      return "set up fds" + rank;
    case kChdir:
      return absl::StrCat("chdir to ", spec.cwd, rank);
    case kExec:
      return absl::StrCat("exec ", spec.argv[0], rank);
    case kSetUser:
      return absl::StrCat("switch to user ", spec.user->name, " (uid ", spec.user->uid, ", gid ",
                          spec.user->gid, ")", rank,
                          " (running ranks as another user needs root, or CAP_SETUID and "
                          "CAP_SETGID)");
  }
  return absl::StrCat("start", rank, " (step ", step, ")");
}

void RunOnSpawner(const std::function<void()>& work) { ForkThread::Get().Run(work); }

}  // namespace trainctl::worker::internal
