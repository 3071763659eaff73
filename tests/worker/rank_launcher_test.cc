#include "worker/daemon/rank_launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/daemon/rank_user.h"

namespace trainctl::worker {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kDeadline = absl::Seconds(10);

RankSpec Sh(int rank, const std::string& script) {
  RankSpec spec;
  spec.rank = rank;
  spec.argv = {"/bin/sh", "-c", script};
  return spec;
}

struct ProcStat {
  pid_t pid = 0;
  char state = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
};

std::vector<ProcStat> AllProcesses() {
  std::vector<ProcStat> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (const dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    const std::string stat =
        testing::ReadFileOrEmpty(std::string("/proc/") + entry->d_name + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    ProcStat p;
    p.pid = atoi(entry->d_name);
    if (sscanf(stat.c_str() + paren + 1, " %c %d %d", &p.state, &p.ppid, &p.pgid) == 3) {
      out.push_back(p);
    }
  }
  closedir(proc);
  return out;
}

// Every process (zombies included) in process group `pgid`.
std::vector<pid_t> GroupMembers(pid_t pgid) {
  std::vector<pid_t> out;
  for (const ProcStat& p : AllProcesses()) {
    if (p.pgid == pgid) out.push_back(p.pid);
  }
  return out;
}

// This process's children, zombies included.
std::vector<pid_t> Children() {
  std::vector<pid_t> out;
  for (const ProcStat& p : AllProcesses()) {
    if (p.ppid == getpid()) out.push_back(p.pid);
  }
  return out;
}

// Gone, or a zombie that is not ours to reap.
bool Dead(pid_t pid) {
  waitpid(pid, nullptr, WNOHANG);  // reaps it if it is our child (we are a subreaper)
  const std::string stat = testing::ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || stat[paren + 2] == 'Z';
}

// What a gang reported through its callbacks.
class Recorder {
 public:
  struct Log {
    int rank;
    std::string stream;
    std::string line;
  };

  Gang::Callbacks Callbacks() {
    Gang::Callbacks c;
    c.on_log = [this](int rank, const std::string& stream, std::string line) {
      absl::MutexLock lock(&mu_);
      logs_.push_back({rank, stream, std::move(line)});
    };
    c.on_event = [this](int rank, std::string line) {
      absl::MutexLock lock(&mu_);
      events_.emplace_back(rank, std::move(line));
    };
    c.on_exit = [this](const GangResult& result) {
      absl::MutexLock lock(&mu_);
      ++exits_;
      result_ = result;
    };
    return c;
  }

  // The lines of `rank` on `stream`, in order.
  std::vector<std::string> Lines(int rank, const std::string& stream) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const Log& log : logs_) {
      if (log.rank == rank && log.stream == stream) out.push_back(log.line);
    }
    return out;
  }
  bool HasLine(int rank, const std::string& line) const {
    absl::MutexLock lock(&mu_);
    return std::any_of(logs_.begin(), logs_.end(),
                       [&](const Log& log) { return log.rank == rank && log.line == line; });
  }
  std::vector<std::pair<int, std::string>> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  int exits() const {
    absl::MutexLock lock(&mu_);
    return exits_;
  }
  GangResult result() const {
    absl::MutexLock lock(&mu_);
    return result_.value_or(GangResult{});
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Log> logs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, std::string>> events_ ABSL_GUARDED_BY(mu_);
  int exits_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<GangResult> result_ ABSL_GUARDED_BY(mu_);
};

class RankLauncherTest : public ::testing::Test {
 protected:
  // Orphaned grandchildren are reparented to this process, which the gang then reaps: pid 1 of
  // many containers (this one's included) never reaps, and the tests check for zombies.
  static void SetUpTestSuite() { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

  void TearDown() override { EXPECT_THAT(Children(), IsEmpty()) << "zombies or leftovers"; }

  std::unique_ptr<Gang> StartGang(std::vector<RankSpec> ranks,
                                  absl::Duration kill_grace = absl::Seconds(10)) {
    auto gang = Gang::Start(std::move(ranks), recorder_.Callbacks(), kill_grace);
    EXPECT_TRUE(gang.ok()) << gang.status();
    return gang.ok() ? *std::move(gang) : nullptr;
  }

  testing::TempDir tmp_;
  Recorder recorder_;  // outlives the gangs of a test
};

TEST_F(RankLauncherTest, TwoRanksSucceed) {
  auto gang = StartGang({Sh(4, "echo four"), Sh(7, "exit 0")});
  ASSERT_NE(gang, nullptr);
  ASSERT_EQ(gang->pids().size(), 2u);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_TRUE(gang->done());
  const GangResult result = recorder_.result();
  EXPECT_TRUE(result.succeeded);
  EXPECT_FALSE(result.cancelled);
  EXPECT_FALSE(result.first_failure.has_value());
  ASSERT_EQ(result.exits.size(), 2u);
  EXPECT_EQ(result.exits[0].rank, 4);
  EXPECT_EQ(result.exits[0].exit_code, 0);
  EXPECT_THAT(result.exits[0].last_lines, ElementsAre("four"));
  EXPECT_EQ(result.exits[1].rank, 7);
  EXPECT_EQ(result.exits[1].exit_code, 0);
  EXPECT_EQ(result.exits[1].signal, 0);
  EXPECT_EQ(recorder_.exits(), 1);
  for (pid_t pid : gang->pids()) EXPECT_THAT(GroupMembers(pid), IsEmpty());
}

TEST_F(RankLauncherTest, EnvironmentAndEventsReachTheRank) {
  RankSpec spec = Sh(2,
                     "echo \"$TRAINCTL_TEST_VALUE $HOME $TRAINCTL_EVENT_FD\"; "
                     "echo '{\"type\":\"metric\"}' >&3; printf 'last-event' >&3");
  spec.env = {{"TRAINCTL_TEST_VALUE", "forty-two"}, {"HOME", "/overridden-home"}};
  auto gang = StartGang({spec});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_THAT(recorder_.Lines(2, "stdout"), ElementsAre("forty-two /overridden-home 3"));
  using Event = std::pair<int, std::string>;
  EXPECT_THAT(recorder_.events(),
              ElementsAre(Event{2, "{\"type\":\"metric\"}"}, Event{2, "last-event"}));
  EXPECT_TRUE(recorder_.result().succeeded);
}

// systemd's notify socket is the worker daemon's (Type=notify), not its ranks'.
TEST_F(RankLauncherTest, RanksDoNotInheritTheNotifySocket) {
  ASSERT_EQ(setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1), 0);
  auto gang = StartGang({Sh(0, "echo \"socket=${NOTIFY_SOCKET-unset}\"")});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  unsetenv("NOTIFY_SOCKET");
  EXPECT_THAT(recorder_.Lines(0, "stdout"), ElementsAre("socket=unset"));
}

TEST_F(RankLauncherTest, OutputGoesToTheLogFileAndOnLogWithItsStream) {
  RankSpec fresh = Sh(0, "echo out1; echo err1 >&2; echo out2; printf no-newline");
  fresh.log_path = tmp_.path() + "/logs/nested/rank0.log";  // directories created
  RankSpec appended = Sh(1, "echo hello; echo oops >&2");
  appended.log_path = tmp_.Write("rank1.log", "previous attempt\n");
  auto gang = StartGang({fresh, appended});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));

  EXPECT_THAT(recorder_.Lines(0, "stdout"), ElementsAre("out1", "out2", "no-newline"));
  EXPECT_THAT(recorder_.Lines(0, "stderr"), ElementsAre("err1"));
  EXPECT_THAT(recorder_.Lines(1, "stdout"), ElementsAre("hello"));
  EXPECT_THAT(recorder_.Lines(1, "stderr"), ElementsAre("oops"));
  // Both streams in one file; their order across the two pipes is the order they were read in.
  EXPECT_THAT(
      std::vector<std::string>(absl::StrSplit(testing::ReadFileOrEmpty(fresh.log_path), '\n')),
      UnorderedElementsAre("out1", "err1", "out2", "no-newline", ""));
  const std::string log1 = testing::ReadFileOrEmpty(appended.log_path);
  EXPECT_EQ(log1.rfind("previous attempt\n", 0), 0u) << log1;
  EXPECT_THAT(std::vector<std::string>(absl::StrSplit(log1, '\n')),
              UnorderedElementsAre("previous attempt", "hello", "oops", ""));
}

TEST_F(RankLauncherTest, VeryLongLinesAreSplit) {
  auto gang = StartGang({Sh(0, "head -c 200000 /dev/zero | tr '\\0' a; echo; echo after")});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  const std::vector<std::string> lines = recorder_.Lines(0, "stdout");
  std::vector<size_t> sizes;
  for (const std::string& line : lines) sizes.push_back(line.size());
  EXPECT_THAT(sizes, ElementsAre(kMaxRankLineBytes, kMaxRankLineBytes, kMaxRankLineBytes,
                                 200000 - 3 * kMaxRankLineBytes, 5));
  EXPECT_EQ(lines.back(), "after");
}

TEST_F(RankLauncherTest, ChildStartsWithDefaultSignalsAndNoInheritedFds) {
  // As the daemon does: SIGPIPE ignored, SIGTERM blocked (the spawner blocks everything anyway).
  struct sigaction ignore {
  }, old_pipe{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &old_pipe), 0);
  sigset_t term, old_mask;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old_mask), 0);
  // An fd without O_CLOEXEC that the rank must not inherit.
  const int leaked = dup2(STDERR_FILENO, 100);
  ASSERT_EQ(leaked, 100);

  RankSpec signals;
  signals.rank = 0;
  signals.argv = {"/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"};
  RankSpec fds;
  fds.rank = 1;
  fds.argv = {"/bin/ls", "/proc/self/fd"};
  auto gang = StartGang({signals, fds});
  close(leaked);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));

  EXPECT_THAT(recorder_.Lines(0, "stdout"),
              ElementsAre("SigBlk:\t0000000000000000", "SigIgn:\t0000000000000000"));
  // 0-3, and the directory ls itself opened to list them.
  const std::vector<std::string> open_fds = recorder_.Lines(1, "stdout");
  EXPECT_THAT(open_fds, ::testing::IsSupersetOf({"0", "1", "2", "3"}));
  EXPECT_LE(open_fds.size(), 5u) << ::testing::PrintToString(open_fds);
  EXPECT_THAT(open_fds, Not(Contains("100")));
}

TEST_F(RankLauncherTest, CwdIsTheRanksWorkingDirectory) {
  RankSpec spec = Sh(0, "pwd");
  spec.cwd = tmp_.path();
  auto gang = StartGang({spec});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_THAT(recorder_.Lines(0, "stdout"),
              ElementsAre(std::filesystem::canonical(tmp_.path()).string()));
}

TEST_F(RankLauncherTest, FailingRankStopsTheGangFast) {
  const absl::Time start = absl::Now();
  auto gang = StartGang({Sh(0, "exec sleep 1000"),
                         Sh(1,
                            "i=0; while [ $i -lt 30 ]; do echo line$i >&2; i=$((i+1)); done; "
                            "echo oops >&2; exit 3")});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // SIGTERM, not the 10 s grace
  const GangResult result = recorder_.result();
  EXPECT_FALSE(result.succeeded);
  EXPECT_FALSE(result.cancelled);
  ASSERT_TRUE(result.first_failure.has_value());
  EXPECT_EQ(result.first_failure->rank, 1);
  EXPECT_EQ(result.first_failure->exit_code, 3);
  EXPECT_EQ(result.first_failure->signal, 0);
  ASSERT_EQ(result.first_failure->last_lines.size(), kRankTailLines);
  EXPECT_EQ(result.first_failure->last_lines.front(), "line11");
  EXPECT_EQ(result.first_failure->last_lines.back(), "oops");
  ASSERT_EQ(result.exits.size(), 2u);
  EXPECT_EQ(result.exits[0].exit_code, -1);
  EXPECT_EQ(result.exits[0].signal, SIGTERM);
  for (pid_t pid : gang->pids()) EXPECT_THAT(GroupMembers(pid), IsEmpty());
}

TEST_F(RankLauncherTest, RankKilledBySignalIsTheFailure) {
  auto gang = StartGang({Sh(0, "exec sleep 1000"), Sh(1, "echo bye; kill -KILL $$")});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  const GangResult result = recorder_.result();
  EXPECT_FALSE(result.succeeded);
  ASSERT_TRUE(result.first_failure.has_value());
  EXPECT_EQ(result.first_failure->rank, 1);
  EXPECT_EQ(result.first_failure->exit_code, -1);
  EXPECT_EQ(result.first_failure->signal, SIGKILL);
  EXPECT_THAT(result.first_failure->last_lines, ElementsAre("bye"));
  EXPECT_EQ(result.exits[0].signal, SIGTERM);
}

TEST_F(RankLauncherTest, CancelSendsSigtermThenSigkillAfterTheGrace) {
  constexpr absl::Duration kGrace = absl::Milliseconds(300);
  auto gang = StartGang(
      {Sh(0, "echo ready; exec sleep 1000"), Sh(1, "trap '' TERM; echo ready; exec sleep 1000")},
      kGrace);
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(testing::WaitFor(
      [&] { return recorder_.HasLine(0, "ready") && recorder_.HasLine(1, "ready"); }, kDeadline));
  EXPECT_FALSE(gang->done());
  const absl::Time cancelled_at = absl::Now();
  gang->Cancel();
  gang->Cancel();  // idempotent
  ASSERT_TRUE(gang->Wait(kDeadline));
  const absl::Duration took = absl::Now() - cancelled_at;
  EXPECT_GE(took, kGrace);
  EXPECT_LT(took, kGrace + absl::Seconds(3));
  const GangResult result = recorder_.result();
  EXPECT_TRUE(result.cancelled);
  EXPECT_FALSE(result.succeeded);
  EXPECT_FALSE(result.first_failure.has_value());
  EXPECT_EQ(result.exits[0].signal, SIGTERM);
  EXPECT_EQ(result.exits[1].signal, SIGKILL);
  EXPECT_EQ(recorder_.exits(), 1);
}

TEST_F(RankLauncherTest, NothingOfARankOutlivesTheGang) {
  // The rank exits 0 and leaves two grandchildren in its group: one holds the rank's pipes, the
  // other has closed them and ignores SIGTERM (the rank waits on a fifo until it has said so).
  constexpr absl::Duration kGrace = absl::Milliseconds(200);
  ASSERT_EQ(mkfifo((tmp_.path() + "/trapped").c_str(), 0600), 0);
  RankSpec spec = Sh(0,
                     "sleep 1000 & echo $! >&3; "
                     "(trap '' TERM; echo > trapped; exec sleep 1000) </dev/null >/dev/null 2>&1 "
                     "3>&- & echo $! >&3; "
                     "read line < trapped; exit 0");
  spec.cwd = tmp_.path();
  const absl::Time start = absl::Now();
  auto gang = StartGang({spec}, kGrace);
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_GE(absl::Now() - start, kGrace);  // the second one needed SIGKILL
  EXPECT_TRUE(recorder_.result().succeeded);
  const auto events = recorder_.events();
  ASSERT_EQ(events.size(), 2u);
  for (const auto& [rank, pid] : events) {
    EXPECT_FALSE(std::filesystem::exists("/proc/" + pid)) << "grandchild " << pid;
  }
  EXPECT_THAT(GroupMembers(gang->pids()[0]), IsEmpty());
}

TEST_F(RankLauncherTest, ZombiesThatInitDoesNotReapDoNotHoldTheGangOpen) {
  // Without the subreaper the grandchild goes to pid 1, which in many containers never reaps.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
  const absl::Time start = absl::Now();
  auto gang = StartGang({Sh(0, "sleep 1000 & exit 0")});
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // SIGTERM did it; not the 10 s grace
  EXPECT_TRUE(recorder_.result().succeeded);
  for (const ProcStat& p : AllProcesses()) {
    if (p.pgid == gang->pids()[0]) {
      EXPECT_EQ(p.state, 'Z') << p.pid;
    }
  }
}

TEST_F(RankLauncherTest, MissingBinaryFailsStartAndLeavesNothingRunning) {
  RankSpec missing;
  missing.rank = 1;
  missing.argv = {"/nonexistent/trainctl-no-such-binary", "--flag"};
  auto gang = Gang::Start({Sh(0, "sleep 1000 & exec sleep 1000"), missing}, recorder_.Callbacks(),
                          absl::Seconds(10));
  ASSERT_FALSE(gang.ok());
  EXPECT_EQ(gang.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gang.status().message(), HasSubstr("/nonexistent/trainctl-no-such-binary"));
  EXPECT_THAT(gang.status().message(), HasSubstr("No such file or directory"));
  EXPECT_EQ(recorder_.exits(), 0);
  // TearDown: no child of this process left (rank 0 and its grandchild were killed and reaped).
}

TEST_F(RankLauncherTest, NotExecutableAndBadCwdFailStart) {
  RankSpec script;
  script.argv = {tmp_.Write("not-executable.sh", "#!/bin/sh\necho hi\n")};
  auto gang = Gang::Start({script}, recorder_.Callbacks(), absl::Seconds(1));
  ASSERT_FALSE(gang.ok());
  EXPECT_EQ(gang.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(gang.status().message(), HasSubstr(script.argv[0]));
  EXPECT_THAT(gang.status().message(), HasSubstr("Permission denied"));

  RankSpec bad_cwd = Sh(0, "pwd");
  bad_cwd.cwd = tmp_.path() + "/missing-dir";
  gang = Gang::Start({bad_cwd}, recorder_.Callbacks(), absl::Seconds(1));
  ASSERT_FALSE(gang.ok());
  EXPECT_THAT(gang.status().message(), HasSubstr("chdir to " + bad_cwd.cwd));
}

TEST_F(RankLauncherTest, InvalidSpecsFailStart) {
  EXPECT_EQ(Gang::Start({}, {}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  RankSpec relative;
  relative.argv = {"sh", "-c", "true"};
  EXPECT_EQ(Gang::Start({relative}, {}, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  RankSpec log_in_a_file = Sh(0, "true");
  log_in_a_file.log_path = tmp_.Write("file", "") + "/rank.log";
  auto gang = Gang::Start({log_in_a_file}, {}, absl::Seconds(1));
  ASSERT_FALSE(gang.ok());
  EXPECT_THAT(gang.status().message(), HasSubstr(log_in_a_file.log_path));
}

TEST_F(RankLauncherTest, DestructorKillsAndReapsRunningRanks) {
  auto gang = StartGang({Sh(0, "sleep 1000 & exec sleep 1000"), Sh(1, "exec sleep 1000")});
  ASSERT_NE(gang, nullptr);
  const std::vector<pid_t> pids = gang->pids();
  const absl::Time start = absl::Now();
  gang.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));  // SIGKILL, not the 10 s grace
  EXPECT_EQ(recorder_.exits(), 0);
  for (pid_t pid : pids) {
    EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), -1);  // already reaped
    EXPECT_THAT(GroupMembers(pid), IsEmpty());
  }
}

TEST_F(RankLauncherTest, RanksDieWithTheProcessThatStartedThem) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t helper = fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {
    // A daemon that dies without cleaning up: no destructors, no Cancel.
    close(pipe_fds[0]);
    auto gang = Gang::Start({Sh(0, "exec sleep 1000")}, {}, absl::Seconds(10));
    const pid_t rank = gang.ok() ? (*gang)->pids()[0] : -1;
    _exit(write(pipe_fds[1], &rank, sizeof(rank)) == sizeof(rank) ? 0 : 1);
  }
  close(pipe_fds[1]);
  pollfd readable = {pipe_fds[0], POLLIN, 0};
  pid_t rank = -1;
  const bool got =
      poll(&readable, 1, 10000) == 1 && read(pipe_fds[0], &rank, sizeof(rank)) == sizeof(rank);
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(helper, &status, 0), helper);
  ASSERT_TRUE(got);
  ASSERT_GT(rank, 0);
  const bool died = testing::WaitFor([&] { return Dead(rank); }, absl::Seconds(5));
  if (!died) kill(-rank, SIGKILL);
  EXPECT_TRUE(died);
  // The rank was reparented to this process (the subreaper); Dead() reaped it.
  EXPECT_TRUE(
      testing::WaitFor([&] { return Dead(rank) && GroupMembers(rank).empty(); }, absl::Seconds(5)));
}

TEST_F(RankLauncherTest, GangsStartConcurrentlyFromManyThreads) {
  constexpr int kThreads = 4;
  Recorder recorders[kThreads];
  bool ok[kThreads] = {};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto gang = Gang::Start({Sh(0, "echo a"), Sh(1, "echo b")}, recorders[t].Callbacks(),
                              absl::Seconds(10));
      ok[t] = gang.ok() && (*gang)->Wait(kDeadline) && recorders[t].result().succeeded;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

// The worker's token is its credential (worker_main reads $TRAINCTL_TOKEN), not its ranks'.
TEST_F(RankLauncherTest, RanksDoNotInheritTheWorkersToken) {
  ASSERT_EQ(setenv("TRAINCTL_TOKEN", "worker-secret", 1), 0);
  auto gang = StartGang({Sh(0, "echo \"token=${TRAINCTL_TOKEN-unset}\"")});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  unsetenv("TRAINCTL_TOKEN");
  EXPECT_THAT(recorder_.Lines(0, "stdout"), ElementsAre("token=unset"));
}

// --rank_user: the rank runs as that user with its groups only, and a 0600 file of the daemon's
// user (its token file, its TLS key) is out of its reach.
TEST_F(RankLauncherTest, RankRunsAsAnotherUserAndCannotReadTheDaemonsCredentials) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  auto nobody = LookUpRankUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  ASSERT_TRUE(CheckCanRunAs(*nobody).ok());
  const std::string token = tmp_.path() + "/token";
  { std::ofstream(token) << "worker-secret\n"; }
  ASSERT_EQ(chmod(token.c_str(), 0600), 0);
  ASSERT_EQ(chmod(tmp_.path().c_str(), 0755), 0);
  RankSpec spec = Sh(
      0, "id -u; id -G; echo \"$HOME $USER\"; cat " + token + " 2>/dev/null || echo cannot-read");
  spec.user = *nobody;
  auto gang = StartGang({spec});
  ASSERT_NE(gang, nullptr);
  ASSERT_TRUE(gang->Wait(kDeadline));
  EXPECT_THAT(recorder_.Lines(0, "stdout"),
              ElementsAre(absl::StrCat(nobody->uid), absl::StrCat(nobody->gid),
                          absl::StrCat(nobody->home, " nobody"), "cannot-read"));
}

// A daemon without the privilege to switch users says so, at start-up (CheckCanRunAs) and at
// Gang::Start, rather than running the rank as itself.
TEST_F(RankLauncherTest, SwitchingUsersWithoutThePrivilegeIsAClearError) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become an unprivileged user first";
  auto nobody = LookUpRankUser("nobody");
  auto root = LookUpRankUser("0");
  ASSERT_TRUE(nobody.ok() && root.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // As nobody, try to run a rank as root. Exit codes say what went wrong.
    if (setgroups(0, nullptr) != 0 || setgid(nobody->gid) != 0 || setuid(nobody->uid) != 0) {
      _exit(10);
    }
    const absl::Status check = CheckCanRunAs(*root);
    if (check.code() != absl::StatusCode::kPermissionDenied ||
        !absl::StrContains(check.message(), "cannot run ranks as user root") ||
        !absl::StrContains(check.message(), "CAP_SETUID")) {
      _exit(11);
    }
    RankSpec spec = Sh(0, "exit 0");
    spec.user = *root;
    auto gang = Gang::Start({spec}, {}, absl::Seconds(1));
    if (gang.ok() || gang.status().code() != absl::StatusCode::kPermissionDenied ||
        !absl::StrContains(gang.status().message(),
                           "switch to user root (uid 0, gid 0) for rank 0")) {
      _exit(12);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The output directories the worker creates for a rank user are that user's; existing ones are
// left to their owner.
TEST_F(RankLauncherTest, OutputDirectoriesAreMadeForTheRankUser) {
  if (geteuid() != 0) GTEST_SKIP() << "chown needs root";
  auto nobody = LookUpRankUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  const std::string dir = tmp_.path() + "/out/job/stage";
  ASSERT_TRUE(MakeRankOutputDir(dir, *nobody).ok());
  struct stat st {};
  for (const std::string& d : {tmp_.path() + "/out", tmp_.path() + "/out/job", dir}) {
    ASSERT_EQ(stat(d.c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_uid, nobody->uid) << d;
  }
  ASSERT_EQ(stat(tmp_.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, geteuid());
}

}  // namespace
}  // namespace trainctl::worker
