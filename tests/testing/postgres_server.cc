#include "tests/testing/postgres_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/fork_thread.h"
#include "tests/testing/subprocess.h"

extern char** environ;

namespace trainctl::testing {
namespace {

// File-local names carry a Pg prefix: the library is a unity build.
constexpr absl::Duration kPgReadyTimeout = absl::Seconds(30);
constexpr absl::Duration kPgPoll = absl::Milliseconds(20);
constexpr char kPgMissing[] =
    "PostgreSQL server binaries (initdb, postgres) not found in `pg_config --bindir`, "
    "/usr/lib/postgresql/*/bin or PATH: install Debian's postgresql package (scripts/setup.sh "
    "does)";

// Everything a child needs, prepared before fork: the child only makes system calls.
struct PgChildPlan {
  std::vector<std::string> argv;
  int log_fd = -1;    // stdout and stderr
  std::string cwd;    // the temp directory: the test's cwd may be closed to nobody
  bool drop = false;  // setuid to uid/gid (the test runs as root)
  uid_t uid = 0;
  gid_t gid = 0;
  int death_signal = SIGKILL;
};

// Async-signal-safe: the forked child of a threaded process may not allocate.
[[noreturn]] void PgChildFail(int fd, const char* step) {
  constexpr char kPrefix[] = "postgres_server child: failed: ";
  if (write(fd, kPrefix, sizeof(kPrefix) - 1) < 0 || write(fd, step, strlen(step)) < 0 ||
      write(fd, "\n", 1) < 0) {
    // Nobody to tell; the exit status says it.
  }
  _exit(127);
}

// In the forked child: own process group, credentials dropped (raw system calls: glibc's wrappers
// would signal the parent's other threads), then PR_SET_PDEATHSIG (a change of credentials clears
// it), default signals, the log as stdout/stderr, no other inherited descriptor, exec.
[[noreturn]] void PgRunChild(const PgChildPlan& plan, char* const* argv, pid_t parent,
                             int null_fd) {
  const int log = plan.log_fd;
  if (setpgid(0, 0) != 0) PgChildFail(log, "setpgid");
  if (plan.drop && (syscall(SYS_setgroups, 0, nullptr) != 0 ||
                    syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) != 0 ||
                    syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0)) {
    PgChildFail(log, "dropping to the unprivileged user");
  }
  if (prctl(PR_SET_PDEATHSIG, plan.death_signal) != 0) PgChildFail(log, "prctl");
  if (getppid() != parent) _exit(127);  // the test process died before prctl
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(log, STDOUT_FILENO) < 0 ||
      dup2(log, STDERR_FILENO) < 0) {
    PgChildFail(log, "dup2");
  }
  if (chdir(plan.cwd.c_str()) != 0) PgChildFail(STDERR_FILENO, "chdir");
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
#endif
  {
    for (int fd = 3; fd < 1024; ++fd) close(fd);
  }
  execve(argv[0], argv, environ);
  PgChildFail(STDERR_FILENO, "execve");
}

// Forks `plan` on the fork thread; the child's pid, or an error.
absl::StatusOr<pid_t> PgSpawn(const PgChildPlan& plan) {
  std::vector<char*> argv;
  for (const std::string& a : plan.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) return absl::InternalError(absl::StrCat("open /dev/null: ", strerror(errno)));
  pid_t pid = -1;
  int fork_errno = 0;
  ForkThread::Get().Run([&] {
    const pid_t parent = getpid();
    pid = fork();
    if (pid == 0) PgRunChild(plan, argv.data(), parent, null_fd);
    fork_errno = errno;
  });
  close(null_fd);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(fork_errno)));
  return pid;
}

// Reaps `pid` if it has exited: its wait status, or nullopt while it runs.
std::optional<int> PgReaped(pid_t pid, int options = WNOHANG) {
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, options);
    if (r == pid) return status;
    if (r == 0) return std::nullopt;
    if (errno != EINTR) return 0;  // not our child any more: reaped elsewhere
  }
}

// Polls until `pid` exits (reaping it) or `timeout` passes.
std::optional<int> PgWaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<int> status = PgReaped(pid)) return status;
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::string PgDescribe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("status ", status);
}

std::string PgTail(const std::string& text, size_t max = 4000) {
  return text.size() <= max ? text : "..." + text.substr(text.size() - max);
}

// A process from /proc/PID/stat: its state letter and parent; nullopt when it is gone.
struct PgProcStat {
  char state = '?';
  pid_t ppid = 0;
};
std::optional<PgProcStat> PgReadProcStat(pid_t pid) {
  const std::string stat = ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 1), ' ', absl::SkipEmpty());
  PgProcStat result;
  if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &result.ppid)) return std::nullopt;
  result.state = fields[0][0];
  return result;
}

// The processes whose parent is `parent` (the postmaster's backends and auxiliary processes).
std::vector<pid_t> PgChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return children;
  while (const dirent* entry = readdir(proc)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::optional<PgProcStat> stat = PgReadProcStat(pid);
    if (stat.has_value() && stat->ppid == parent) children.push_back(pid);
  }
  closedir(proc);
  return children;
}

// Gone, or a zombie that nobody reaps (an orphan in a container whose init does not): either way
// it holds no shared memory and no socket.
bool PgProcessGone(pid_t pid) {
  std::optional<PgProcStat> stat = PgReadProcStat(pid);
  return !stat.has_value() || stat->state == 'Z' || stat->state == 'X';
}

std::string PgOnPath(const std::string& name) {
  const char* path = getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "/usr/bin:/bin" : path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

bool PgHasServer(const std::string& dir) {
  return !dir.empty() && access((dir + "/postgres").c_str(), X_OK) == 0 &&
         access((dir + "/initdb").c_str(), X_OK) == 0;
}

// `pg_config --bindir` when it holds the server, else the newest /usr/lib/postgresql/*/bin, else
// the directory of `postgres` on PATH.
absl::StatusOr<std::string> PgFindBinDir() {
  if (const std::string pg_config = PgOnPath("pg_config"); !pg_config.empty()) {
    RunResult r = Run({pg_config, "--bindir"}, {}, absl::Seconds(30));
    const std::string dir(absl::StripAsciiWhitespace(r.out));
    if (r.exit_code == 0 && PgHasServer(dir)) return dir;
  }
  std::string best;
  std::pair<int, int> best_version{-1, -1};
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
    const std::string name = entry.path().filename().string();  // "15", or "9.6"
    std::vector<std::string> parts = absl::StrSplit(name, '.');
    std::pair<int, int> version{-1, 0};
    if (!absl::SimpleAtoi(parts[0], &version.first)) continue;
    if (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &version.second)) continue;
    const std::string dir = entry.path().string() + "/bin";
    if (version > best_version && PgHasServer(dir)) best = dir, best_version = version;
  }
  if (!best.empty()) return best;
  const std::string postgres = PgOnPath("postgres");
  const std::string dir = postgres.substr(0, postgres.rfind('/'));
  if (!postgres.empty() && PgHasServer(dir)) return dir;
  return absl::FailedPreconditionError(kPgMissing);
}

// Every directory from / down to `path` searchable by others (the unprivileged user).
bool PgTraversable(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path);
  for (; !p.empty(); p = p.parent_path()) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) return false;
    if (p == p.root_path()) break;
  }
  return true;
}

// A fresh directory (0711) under $TMPDIR, or /tmp when nobody could reach $TMPDIR, with data/
// (0700) owned by the server's user.
absl::StatusOr<std::string> PgMakeDir(bool drop, uid_t uid, gid_t gid) {
  const char* tmpdir = getenv("TMPDIR");
  std::string base = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  if (drop && !PgTraversable(base)) base = "/tmp";
  std::string dir = base + "/trainctl-postgres-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir, ": ", strerror(errno)));
  }
  const std::string data = dir + "/data";
  if (chmod(dir.c_str(), 0711) != 0 || mkdir(data.c_str(), 0700) != 0 ||
      (drop && chown(data.c_str(), uid, gid) != 0)) {
    const std::string error = strerror(errno);
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    return absl::InternalError(absl::StrCat("preparing ", data, ": ", error));
  }
  return dir;
}

int PgOpenLog(const std::string& path) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

}  // namespace

PostgresServer::PostgresServer(std::string bin_dir, std::string dir, uid_t uid, gid_t gid)
    : bin_dir_(std::move(bin_dir)),
      dir_(std::move(dir)),
      uid_(uid),
      gid_(gid),
      owner_pid_(getpid()) {}

absl::StatusOr<std::unique_ptr<PostgresServer>> PostgresServer::Start() {
  absl::StatusOr<std::string> bin_dir = PgFindBinDir();
  if (!bin_dir.ok()) return bin_dir.status();
  const bool root = geteuid() == 0;
  uid_t uid = getuid();
  gid_t gid = getgid();
  if (root) {  // PostgreSQL refuses to run as root
    const passwd* nobody = getpwnam("nobody");
    if (nobody == nullptr) return absl::FailedPreconditionError("running as root, no user nobody");
    const group* nogroup = getgrnam("nogroup");
    uid = nobody->pw_uid;
    gid = nogroup != nullptr ? nogroup->gr_gid : nobody->pw_gid;
  }
  absl::StatusOr<std::string> dir = PgMakeDir(root, uid, gid);
  if (!dir.ok()) return dir.status();
  // From here the destructor removes the directory (pid_ is -1: nothing to stop).
  std::unique_ptr<PostgresServer> server(new PostgresServer(*bin_dir, *dir, uid, gid));

  const std::string initdb_log = *dir + "/initdb.log";
  PgChildPlan plan{{*bin_dir + "/initdb", "-D", *dir + "/data", "-A", "trust", "-U", "trainctl",
                    "--no-sync", "-E", "UTF8", "--locale=C"},
                   PgOpenLog(initdb_log),
                   *dir,
                   root,
                   uid,
                   gid,
                   SIGKILL};
  if (plan.log_fd < 0) return absl::InternalError("cannot create " + initdb_log);
  absl::StatusOr<pid_t> initdb = PgSpawn(plan);
  close(plan.log_fd);
  if (!initdb.ok()) return initdb.status();
  std::optional<int> status = PgWaitExit(*initdb, absl::Seconds(120));
  if (!status.has_value()) {
    kill(*initdb, SIGKILL);
    status = PgReaped(*initdb, 0);
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat(plan.argv[0], " failed (", PgDescribe(*status),
                                            "): ", PgTail(ReadFileOrEmpty(initdb_log))));
  }

  // The port was free a moment ago; another process may take it first: then another one.
  absl::MutexLock lock(&server->mu_);
  absl::Status started;
  for (int attempt = 0; attempt < 3; ++attempt) {
    server->port_ = FreeLoopbackPort();
    if (server->port_ == 0) return absl::InternalError("no free port on 127.0.0.1");
    started = server->Launch();
    if (started.ok() || started.message().find("could not bind") == std::string::npos) break;
  }
  if (!started.ok()) return started;
  return server;
}

absl::Status PostgresServer::Launch() {
  const std::string log_path = dir_ + "/postgres.log";
  PgChildPlan plan{{bin_dir_ + "/postgres", "-D", dir_ + "/data", "-c",
                    "listen_addresses=127.0.0.1", "-c", absl::StrCat("port=", port_), "-c",
                    "unix_socket_directories=", "-c", "fsync=off", "-c", "full_page_writes=off"},
                   PgOpenLog(log_path),
                   dir_,
                   geteuid() == 0,
                   uid_,
                   gid_,
                   SIGQUIT};  // immediate shutdown when the test process dies
  if (plan.log_fd < 0) return absl::InternalError("cannot create " + log_path);
  absl::StatusOr<pid_t> pid = PgSpawn(plan);
  close(plan.log_fd);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  const std::string ping_uri = AdminUri();
  const absl::Time deadline = absl::Now() + kPgReadyTimeout;
  while (true) {
    if (std::optional<int> status = PgReaped(pid_)) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("postgres exited (", PgDescribe(*status),
                                              ") before accepting connections on port ", port_,
                                              "; its log: ", PgTail(Log())));
    }
    if (PQping(ping_uri.c_str()) == PQPING_OK) return absl::OkStatus();
    if (absl::Now() > deadline) break;
    absl::SleepFor(kPgPoll);
  }
  const std::string log = Log();
  const absl::Status killed = KillLocked();
  return absl::DeadlineExceededError(
      absl::StrCat("postgres did not accept connections on port ", port_, " within ",
                   absl::FormatDuration(kPgReadyTimeout), " (killed: ", killed.ToString(),
                   "); its log: ", PgTail(log)));
}

absl::Status PostgresServer::KillLocked() {
  if (pid_ <= 0) return absl::FailedPreconditionError("postgres is not running");
  // Stopped first, so that it forks no backend between the listing and the kill.
  kill(pid_, SIGSTOP);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool exited = false;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG | WUNTRACED);
    if (r == pid_) {
      exited = !WIFSTOPPED(status);
      break;
    }
    if (r < 0 && errno != EINTR) {
      exited = true;  // reaped elsewhere
      break;
    }
    if (absl::Now() > deadline) break;  // kill what can be seen
    absl::SleepFor(absl::Milliseconds(1));
  }
  const std::vector<pid_t> backends = PgChildrenOf(pid_);
  for (pid_t backend : backends) kill(backend, SIGKILL);
  if (!exited) {
    kill(pid_, SIGKILL);
    PgReaped(pid_, 0);
  }
  pid_ = -1;
  // Orphans now: init reaps them. Restart needs them gone (their shared memory and sockets).
  if (!WaitFor(
          [&] {
            for (pid_t backend : backends) {
              if (!PgProcessGone(backend)) return false;
            }
            return true;
          },
          absl::Seconds(10))) {
    return absl::DeadlineExceededError("postgres backends still running 10 s after SIGKILL");
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::Kill() {
  absl::MutexLock lock(&mu_);
  return KillLocked();
}

absl::Status PostgresServer::Restart() {
  absl::MutexLock lock(&mu_);
  if (pid_ > 0) return absl::FailedPreconditionError("postgres is running: Kill() it first");
  return Launch();
}

PostgresServer::~PostgresServer() {
  if (getpid() != owner_pid_) return;  // a forked child's exit: the server is not its own
  {
    absl::MutexLock lock(&mu_);
    if (pid_ > 0) {
      kill(pid_, SIGQUIT);  // immediate shutdown: the postmaster quits its backends, then exits
      if (PgWaitExit(pid_, absl::Seconds(10)).has_value()) {
        pid_ = -1;
      } else {
        KillLocked().IgnoreError();
      }
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PostgresServer::AdminUri() const {
  return absl::StrCat("postgresql://trainctl@127.0.0.1:", port_, "/postgres?connect_timeout=10");
}

std::string PostgresServer::Log() const { return ReadFileOrEmpty(dir_ + "/postgres.log"); }

absl::StatusOr<std::string> PostgresServer::CreateDatabase() {
  static std::atomic<int> counter{0};
  const std::string name = absl::StrCat("trainctl_", getpid(), "_", ++counter);
  PGconn* conn = PQconnectdb(AdminUri().c_str());
  absl::Status status;
  if (PQstatus(conn) != CONNECTION_OK) {
    status = absl::UnavailableError(
        absl::StrCat("connecting to postgres on port ", port_, ": ", PQerrorMessage(conn)));
  } else {
    PGresult* result = PQexec(conn, ("CREATE DATABASE " + name).c_str());
    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
      status = absl::InternalError(
          absl::StrCat("CREATE DATABASE ", name, ": ", PQresultErrorMessage(result)));
    }
    PQclear(result);
  }
  PQfinish(conn);
  if (!status.ok()) return status;
  return absl::StrCat("postgresql://trainctl@127.0.0.1:", port_, "/", name);
}

absl::StatusOr<PostgresServer*> SharedPostgres() {
  // Destroyed at exit, which stops the server; a failed start is kept and returned every time.
  static const absl::StatusOr<std::unique_ptr<PostgresServer>> shared = PostgresServer::Start();
  if (!shared.ok()) return shared.status();
  return shared->get();
}

}  // namespace trainctl::testing
