#include "worker/daemon/run_program.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace trainctl::worker {

absl::StatusOr<std::string> RunWithTimeout(const std::vector<std::string>& argv,
                                           absl::Duration timeout, int* exit_status) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::UnavailableError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }
  std::string out;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  while (true) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: every writer is gone
    if (out.size() < (size_t{1} << 20)) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  // Its output is complete; it may still be exiting (or, having closed its stdout, hang on).
  int status = 0;
  pid_t waited = 0;
  while (!timed_out) {
    waited = waitpid(pid, &status, WNOHANG);
    if (waited < 0 && errno == EINTR) continue;
    if (waited != 0) break;
    if (absl::Now() >= deadline) {
      timed_out = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (timed_out) {
    kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    // The worker is a child subreaper: reap what the program left in its group, if anything.
    siginfo_t info{};
    while (waitid(P_PGID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG) == 0 &&
           info.si_pid != 0) {
      info = siginfo_t{};
    }
    return absl::UnavailableError(
        absl::StrCat(argv[0], " did not finish within ", absl::FormatDuration(timeout)));
  }
  if (waited < 0) {
    return absl::UnavailableError(absl::StrCat("waitpid ", argv[0], ": ", std::strerror(errno)));
  }
  *exit_status = status;
  return out;
}

absl::StatusOr<std::string> RunToCompletion(const std::vector<std::string>& argv,
                                            absl::Duration timeout) {
  int status = 0;
  absl::StatusOr<std::string> out = RunWithTimeout(argv, timeout, &status);
  if (!out.ok()) return out.status();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat(argv[0], " failed (",
                     WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                                       : absl::StrCat("signal ", WTERMSIG(status)),
                     "): ", absl::StripAsciiWhitespace(out->substr(0, 500))));
  }
  return out;
}

}  // namespace trainctl::worker
