#include "worker/daemon/rank_launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/utf8.h"
#include "worker/daemon/rank_child.h"

namespace trainctl::worker {
namespace {

using internal::ChildFailure;
using internal::ChildPlan;
using internal::kReportFd;
using internal::ScopedFd;

// How often the supervisor looks again when it has nothing to poll() on: a group that outlives
// its leader (there is no fd that tells when a process group empties), and rank exits when the
// kernel has no pidfd_open.
constexpr absl::Duration kGroupPollInterval = absl::Milliseconds(10);
constexpr absl::Duration kExitPollInterval = absl::Milliseconds(20);
// The final drain reads at most this many buffers per pipe: only a writer that left the rank's
// process group can still be writing then, and it must not hold the gang open.
constexpr int kMaxDrainReads = 64;

// ---------------------------------------------------------------------------------------------
// Preparing a rank, in the daemon.

absl::StatusOr<ScopedFd> OpenLog(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::Status(absl::ErrnoToStatusCode(error.value()),
                          absl::StrCat("create directory ", dir.string(), " for log file ", path,
                                       ": ", error.message()));
    }
  }
  ScopedFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open log file ", path));
  return fd;
}

// ---------------------------------------------------------------------------------------------
// Process groups.

// Reaps members of group `pgid` that are this process's children: a rank's descendants adopted
// because this process is a subreaper (or pid 1). Call only once the leader has been reaped, so
// that its status goes to waitpid.
void ReapAdoptedMembers(pid_t pgid) {
  while (true) {
    siginfo_t info{};
    if (waitid(P_PGID, static_cast<id_t>(pgid), &info, WEXITED | WNOHANG) != 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: none of ours
    }
    if (info.si_pid == 0) return;
  }
}

// Which of `groups` still have a process that is not a zombie (one pass over /proc). When /proc
// cannot be read, all of them.
std::set<pid_t> GroupsWithLiveMembers(const std::set<pid_t>& groups) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return groups;
  std::set<pid_t> live;
  while (const dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    const std::string stat_path = absl::StrCat(entry->d_name, "/stat");
    const ScopedFd fd(openat(dirfd(proc), stat_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) continue;
    char stat[512];
    const ssize_t n = read(fd.get(), stat, sizeof(stat) - 1);
    if (n <= 0) continue;
    stat[n] = '\0';
    const char* after_name = strrchr(stat, ')');  // the name may hold spaces and parentheses
    char state = 0;
    int ppid = 0;
    int group = 0;
    if (after_name != nullptr && sscanf(after_name + 1, " %c %d %d", &state, &ppid, &group) == 3 &&
        state != 'Z' && state != 'X' && groups.count(group) > 0) {
      live.insert(group);
    }
  }
  closedir(proc);
  return live;
}

// ---------------------------------------------------------------------------------------------
// Supervision.

// Splits a byte stream into lines; a line longer than kMaxRankLineBytes comes out in pieces of at
// most that size, cut between UTF-8 characters, so that a stream without newlines is never
// buffered whole and a well-formed line stays well-formed piece by piece.
class LineSplitter {
 public:
  template <typename Emit>
  void Feed(std::string_view data, Emit&& emit) {
    partial_.append(data);
    size_t start = 0;
    while (true) {
      const size_t newline = partial_.find('\n', start);
      const size_t length = (newline == std::string::npos ? partial_.size() : newline) - start;
      if (length > kMaxRankLineBytes) {
        const size_t piece =
            Utf8PrefixLength(absl::string_view(partial_).substr(start, length), kMaxRankLineBytes);
        emit(partial_.substr(start, piece));
        start += piece;
      } else if (newline != std::string::npos) {
        emit(partial_.substr(start, length));
        start = newline + 1;
      } else {
        break;
      }
    }
    partial_.erase(0, start);
  }

  // At EOF: the last line, if it had no newline.
  template <typename Emit>
  void Finish(Emit&& emit) {
    if (!partial_.empty()) emit(std::exchange(partial_, std::string()));
  }

 private:
  std::string partial_;
};

enum Stream : int { kStdout = 0, kStderr = 1, kEvents = 2, kStreams = 3 };
constexpr const char* kStreamNames[kStreams] = {"stdout", "stderr", "events"};

enum class GroupState {
  kRunning,      // not signalled yet
  kTerminating,  // SIGTERM sent; SIGKILL at kill_at
  kKilled,       // SIGKILL sent
  kGone,         // empty (checked only once the leader is reaped)
};

struct RankState {
  int rank = 0;
  pid_t pid = -1;  // also its process group id
  ScopedFd log;
  int64_t max_log_bytes = 0;  // RankSpec::max_log_bytes
  int64_t log_written = 0;    // bytes this run appended to `log`
  ScopedFd pidfd;             // -1 without pidfd_open, or once reaped
  ScopedFd pipes[kStreams];   // read ends, non-blocking; -1 after EOF
  LineSplitter lines[kStreams];
  std::deque<std::string> tail;  // last kRankTailLines lines of stdout and stderr
  bool reaped = false;
  int exit_code = -1;
  int signal = 0;
  GroupState group = GroupState::kRunning;
  absl::Time kill_at = absl::InfiniteFuture();
};

}  // namespace

class Gang::Supervisor {
 public:
  Supervisor(std::vector<RankState> ranks, Callbacks callbacks, absl::Duration kill_grace,
             ScopedFd wake)
      : callbacks_(std::move(callbacks)),
        kill_grace_(std::max(kill_grace, absl::ZeroDuration())),
        wake_(std::move(wake)),
        ranks_(std::move(ranks)),
        buffer_(kMaxRankLineBytes) {}

  // The supervisor thread: returns when every rank is reaped and its group is empty, after
  // on_exit (unless RequestStop() came first).
  void Run() {
    while (true) {
      const absl::Time now = absl::Now();
      ReapRanks(now);  // first: a rank that failed before Cancel() is the gang's failure
      HandleRequests(now);
      UpdateGroups(now);
      if (Finished()) break;
      PollOnce();
    }
    DrainPipes();
    const GangResult result = Result();
    bool stopped;
    {
      absl::MutexLock lock(&mu_);
      stopped = stop_requested_;
    }
    if (!stopped && callbacks_.on_exit) callbacks_.on_exit(result);
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

  void RequestCancel() {
    {
      absl::MutexLock lock(&mu_);
      cancel_requested_ = true;
    }
    Wake();
  }

  // For ~Gang: SIGKILL to every group, no more callbacks.
  void RequestStop() {
    {
      absl::MutexLock lock(&mu_);
      stop_requested_ = true;
    }
    Wake();
  }

  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  bool Wait(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }

 private:
  void Wake() {
    const uint64_t one = 1;
    if (write(wake_.get(), &one, sizeof(one)) < 0) {
      // EAGAIN: the counter is already non-zero, so the supervisor wakes anyway.
    }
  }

  void HandleRequests(absl::Time now) {
    bool cancel, stop;
    {
      absl::MutexLock lock(&mu_);
      cancel = cancel_requested_;
      stop = stop_requested_;
    }
    if (stop && !quiet_) {
      quiet_ = true;
      stopping_ = true;
      for (RankState& r : ranks_) KillGroup(r);
    }
    if (cancel && !stopping_) {
      stopping_ = true;
      cancelled_ =
          std::any_of(ranks_.begin(), ranks_.end(), [](const RankState& r) { return !r.reaped; });
      for (RankState& r : ranks_) TermGroup(r, now);
    }
  }

  void ReapRanks(absl::Time now) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      RankState& r = ranks_[i];
      if (r.reaped) continue;
      int status = 0;
      const pid_t reaped = waitpid(r.pid, &status, WNOHANG);
      if (reaped == 0 || (reaped < 0 && errno == EINTR)) continue;
      r.reaped = true;
      r.pidfd.reset();
      if (reaped == r.pid && WIFEXITED(status)) {
        r.exit_code = WEXITSTATUS(status);
      } else if (reaped == r.pid && WIFSIGNALED(status)) {
        r.signal = WTERMSIG(status);
      }  // else ECHILD: reaped elsewhere (SIGCHLD ignored, a waitpid(-1)); a failure, status lost
      if (r.exit_code != 0 && !stopping_) {  // fail fast
        first_failure_ = static_cast<int>(i);
        stopping_ = true;
        for (RankState& other : ranks_) TermGroup(other, now);
      }
      TermGroup(r, now);  // what the rank left behind in its group
    }
  }

  // SIGKILL after the grace; marks the groups of reaped leaders that are empty — zombies of
  // another parent aside (a pid 1 that never reaps must not hold the gang open).
  void UpdateGroups(absl::Time now) {
    std::set<pid_t> pending;
    for (RankState& r : ranks_) {
      if (r.group == GroupState::kTerminating && now >= r.kill_at) KillGroup(r);
      if (!r.reaped || r.group == GroupState::kGone) continue;
      ReapAdoptedMembers(r.pid);
      if (kill(-r.pid, 0) != 0 && errno == ESRCH) {
        r.group = GroupState::kGone;
      } else {
        pending.insert(r.pid);
      }
    }
    if (pending.empty()) return;
    const std::set<pid_t> live = GroupsWithLiveMembers(pending);
    for (RankState& r : ranks_) {
      if (pending.count(r.pid) == 0 || live.count(r.pid) > 0) continue;
      ReapAdoptedMembers(r.pid);  // ours among the zombies may have died since the first reap
      r.group = GroupState::kGone;
    }
  }

  void TermGroup(RankState& r, absl::Time now) {
    if (r.group != GroupState::kRunning) return;
    if (quiet_) {
      KillGroup(r);
      return;
    }
    SignalGroup(r, SIGTERM);
    if (r.group == GroupState::kGone) return;
    r.group = GroupState::kTerminating;
    r.kill_at = now + kill_grace_;
  }

  void KillGroup(RankState& r) {
    if (r.group == GroupState::kKilled || r.group == GroupState::kGone) return;
    SignalGroup(r, SIGKILL);
    if (r.group != GroupState::kGone) r.group = GroupState::kKilled;
  }

  void SignalGroup(RankState& r, int sig) {
    if (kill(-r.pid, sig) == 0 || errno != ESRCH) return;
    if (r.reaped) {
      r.group = GroupState::kGone;
    } else {
      kill(r.pid, sig);  // the child failed before setsid (Start's error path)
    }
  }

  bool Finished() const {
    return std::all_of(ranks_.begin(), ranks_.end(),
                       [](const RankState& r) { return r.reaped && r.group == GroupState::kGone; });
  }

  // Waits for pipe data, a rank's exit, a request or the next deadline, and reads the pipes.
  void PollOnce() {
    const absl::Time now = absl::Now();
    absl::Time deadline = absl::InfiniteFuture();
    std::vector<pollfd> fds = {{wake_.get(), POLLIN, 0}};
    std::vector<std::pair<RankState*, int>> pipes;  // for fds[1 + k], k < pipes.size()
    for (RankState& r : ranks_) {
      for (int s = 0; s < kStreams; ++s) {
        if (r.pipes[s].get() < 0) continue;
        fds.push_back({r.pipes[s].get(), POLLIN, 0});
        pipes.emplace_back(&r, s);
      }
    }
    for (RankState& r : ranks_) {
      if (!r.reaped && r.pidfd.get() >= 0) fds.push_back({r.pidfd.get(), POLLIN, 0});
      if (!r.reaped && r.pidfd.get() < 0) deadline = std::min(deadline, now + kExitPollInterval);
      if (r.group == GroupState::kTerminating) deadline = std::min(deadline, r.kill_at);
      if (r.reaped && r.group != GroupState::kGone) {
        deadline = std::min(deadline, now + kGroupPollInterval);
      }
    }
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline - now) + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout, EINTR
    if (fds[0].revents != 0) {
      uint64_t count;
      if (read(wake_.get(), &count, sizeof(count)) < 0) {
        // EAGAIN: another poll() already consumed it.
      }
    }
    for (size_t k = 0; k < pipes.size(); ++k) {
      if (fds[1 + k].revents != 0) ReadPipe(*pipes[k].first, pipes[k].second);
    }
  }

  // One read(); false when nothing was there or the pipe ended (then it is closed and its last
  // partial line delivered).
  bool ReadPipe(RankState& r, int stream) {
    const ssize_t n = read(r.pipes[stream].get(), buffer_.data(), buffer_.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    auto deliver = [&](std::string line) { Deliver(r, stream, std::move(line)); };
    if (n <= 0) {
      r.pipes[stream].reset();
      r.lines[stream].Finish(deliver);
      return false;
    }
    r.lines[stream].Feed(std::string_view(buffer_.data(), static_cast<size_t>(n)), deliver);
    return true;
  }

  // Every group is empty: what is left in the pipes was written before.
  void DrainPipes() {
    for (RankState& r : ranks_) {
      for (int s = 0; s < kStreams; ++s) {
        for (int reads = 0; r.pipes[s].get() >= 0 && reads < kMaxDrainReads; ++reads) {
          if (!ReadPipe(r, s)) break;
        }
        if (r.pipes[s].get() >= 0) {  // held open by a process that left the group
          r.pipes[s].reset();
          r.lines[s].Finish([&](std::string line) { Deliver(r, s, std::move(line)); });
        }
      }
    }
  }

  // Best effort: a full disk must not stop supervision. At max_log_bytes the file gets one last
  // line saying so and is closed.
  static void AppendToLog(RankState& r, const std::string& line) {
    std::string text = line;
    const auto bytes = static_cast<int64_t>(line.size()) + 1;
    bool last = false;
    if (r.max_log_bytes > 0 && r.log_written + bytes > r.max_log_bytes) {
      text = absl::StrCat(
          "[trainctl-worker] this rank log reached the worker's --max_rank_log_bytes (",
          r.max_log_bytes, " bytes); later output is not kept here");
      last = true;
    }
    char newline = '\n';
    iovec parts[2] = {{text.data(), text.size()}, {&newline, 1}};
    if (writev(r.log.get(), parts, 2) < 0) {
    }
    r.log_written += bytes;
    if (last) r.log.reset();
  }

  void Deliver(RankState& r, int stream, std::string line) {
    if (stream == kEvents) {
      if (!quiet_ && callbacks_.on_event) callbacks_.on_event(r.rank, std::move(line));
      return;
    }
    if (r.log.get() >= 0) AppendToLog(r, line);
    r.tail.push_back(line);
    if (r.tail.size() > kRankTailLines) r.tail.pop_front();
    if (!quiet_ && callbacks_.on_log)
      callbacks_.on_log(r.rank, kStreamNames[stream], std::move(line));
  }

  GangResult Result() const {
    GangResult result;
    for (const RankState& r : ranks_) {
      result.exits.push_back(RankExit{r.rank, r.exit_code, r.signal,
                                      std::vector<std::string>(r.tail.begin(), r.tail.end())});
    }
    if (first_failure_ >= 0) result.first_failure = result.exits[first_failure_];
    result.cancelled = cancelled_;
    result.succeeded = !cancelled_ && first_failure_ < 0;  // else every rank exited 0
    return result;
  }

  const Callbacks callbacks_;
  const absl::Duration kill_grace_;
  const ScopedFd wake_;  // eventfd: requests interrupt poll()

  mutable absl::Mutex mu_;
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;

  // The supervisor thread's alone.
  std::vector<RankState> ranks_;
  std::vector<char> buffer_;
  bool stopping_ = false;  // every group has been signalled (fail fast, Cancel or ~Gang)
  bool cancelled_ = false;
  bool quiet_ = false;      // ~Gang began: SIGKILL, no callbacks
  int first_failure_ = -1;  // index into ranks_
};

// ---------------------------------------------------------------------------------------------

namespace {

// The pipes, log file and exec arguments of one rank. The child's ends go to `child_ends`.
absl::Status PrepareRank(const RankSpec& spec, int stdin_fd, RankState* state, ChildPlan* plan,
                         ScopedFd* report, std::vector<ScopedFd>* child_ends) {
  state->rank = spec.rank;
  if (!spec.log_path.empty()) {
    absl::StatusOr<ScopedFd> log = OpenLog(spec.log_path);
    if (!log.ok()) return log.status();
    state->log = *std::move(log);
    state->max_log_bytes = spec.max_log_bytes;
  }
  plan->fds[0] = stdin_fd;
  for (int s = 0; s < kStreams; ++s) {
    ScopedFd write_end;
    if (absl::Status status = internal::MakePipe(&state->pipes[s], &write_end); !status.ok())
      return status;
    if (fcntl(state->pipes[s].get(), F_SETFL, O_NONBLOCK) != 0) {
      return absl::ErrnoToStatus(errno, "fcntl(O_NONBLOCK)");
    }
    plan->fds[1 + s] = write_end.get();
    child_ends->push_back(std::move(write_end));
  }
  ScopedFd report_write;
  if (absl::Status status = internal::MakePipe(report, &report_write); !status.ok()) return status;
  plan->fds[kReportFd] = report_write.get();
  child_ends->push_back(std::move(report_write));

  plan->argv_strings = spec.argv;
  plan->env_strings = internal::RankEnvironment(spec.env, spec.user);
  for (std::string& arg : plan->argv_strings) plan->argv.push_back(arg.data());
  plan->argv.push_back(nullptr);
  for (std::string& entry : plan->env_strings) plan->envp.push_back(entry.data());
  plan->envp.push_back(nullptr);
  plan->cwd = spec.cwd;
  plan->user = spec.user;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gang>> Gang::Start(std::vector<RankSpec> specs, Callbacks callbacks,
                                                  absl::Duration kill_grace) {
  if (specs.empty()) return absl::InvalidArgumentError("a gang needs at least one rank");
  for (const RankSpec& spec : specs) {
    if (spec.argv.empty() || spec.argv[0].empty() || spec.argv[0][0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("rank ", spec.rank,
                                                     ": argv[0] must be an absolute path, got \"",
                                                     spec.argv.empty() ? "" : spec.argv[0], "\""));
    }
  }
  ScopedFd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull.get() < 0) return absl::ErrnoToStatus(errno, "open /dev/null");
  ScopedFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (wake.get() < 0) return absl::ErrnoToStatus(errno, "eventfd");

  std::vector<RankState> ranks(specs.size());
  std::vector<ChildPlan> plans(specs.size());
  std::vector<ScopedFd> reports(specs.size());  // read ends of the exec-failure pipes
  std::vector<ScopedFd> child_ends;             // closed here once the children have them
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::Status status =
        PrepareRank(specs[i], devnull.get(), &ranks[i], &plans[i], &reports[i], &child_ends);
    if (!status.ok()) return status;
  }

  const pid_t parent = getpid();
  const int max_fd = internal::MaxFd();
  std::vector<pid_t> pids;
  pids.reserve(specs.size());
  int fork_error = 0;
  internal::RunOnSpawner([&] {
    for (const ChildPlan& plan : plans) {
      const pid_t pid = fork();
      if (pid == 0) internal::RunChild(plan, parent, max_fd);
      if (pid < 0) {
        fork_error = errno;
        return;
      }
      pids.push_back(pid);
    }
  });
  child_ends.clear();

  absl::Status status = absl::OkStatus();
  if (fork_error != 0) {
    status = absl::ErrnoToStatus(fork_error, absl::StrCat("fork rank ", specs[pids.size()].rank));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    ranks[i].pid = pids[i];
    ranks[i].pidfd.reset(internal::PidfdOpen(pids[i]));
    ChildFailure failure;
    // Blocks until the child has exec'd (EOF) or says why it could not.
    if (internal::ReadFully(reports[i].get(), &failure, sizeof(failure)) == sizeof(failure) &&
        status.ok()) {
      status =
          absl::ErrnoToStatus(failure.error, internal::DescribeChildStep(failure.step, specs[i]));
    }
  }
  ranks.resize(pids.size());

  // On error the gang is still built, without callbacks, for ~Gang to kill and reap what started.
  auto supervisor = std::make_unique<Supervisor>(std::move(ranks),
                                                 status.ok() ? std::move(callbacks) : Callbacks{},
                                                 kill_grace, std::move(wake));
  std::unique_ptr<Gang> gang(new Gang(std::move(pids), std::move(supervisor)));
  if (!status.ok()) return status;
  return gang;
}

Gang::Gang(std::vector<pid_t> pids, std::unique_ptr<Supervisor> supervisor)
    : pids_(std::move(pids)),
      supervisor_(std::move(supervisor)),
      thread_([s = supervisor_.get()] { s->Run(); }) {}

Gang::~Gang() {
  supervisor_->RequestStop();
  thread_.join();
}

void Gang::Cancel() { supervisor_->RequestCancel(); }

bool Gang::done() const { return supervisor_->done(); }

bool Gang::Wait(absl::Duration timeout) const { return supervisor_->Wait(timeout); }

}  // namespace trainctl::worker
