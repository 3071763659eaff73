#include "worker/daemon/gpu_metrics.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace trainctl::worker {
namespace {

constexpr int kColumns = 10;
constexpr double kMiB = 1024.0 * 1024.0;

// A field the driver cannot report: "[N/A]", "[Not Supported]", "[Unknown Error]", "N/A", ...
bool IsUnavailable(absl::string_view value) {
  return value.empty() || value == "N/A" ||
         (absl::StartsWith(value, "[") && absl::EndsWith(value, "]"));
}

// Runs argv (argv[0] a path, or a name looked up in PATH) in a process group of its own, stdout and
// stderr into one string, killing the group after `timeout`. The daemon blocks SIGTERM/SIGINT for
// sigwait: the child gets an empty mask and default dispositions.
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

}  // namespace

std::vector<GpuReading> ParseGpuMetricsCsv(absl::string_view csv,
                                           std::vector<std::string>* warnings) {
  std::vector<GpuReading> gpus;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto warn = [&](absl::string_view what) {
      if (warnings != nullptr) {
        warnings->push_back(absl::StrCat("nvidia-smi line ", line_no, " (", line, "): ", what));
      }
    };
    std::vector<absl::string_view> cols = absl::StrSplit(line, ',');
    if (cols.size() != kColumns) {
      warn(absl::StrCat("expected ", kColumns, " comma-separated columns, got ", cols.size(),
                        "; row skipped"));
      continue;
    }
    for (absl::string_view& c : cols) c = absl::StripAsciiWhitespace(c);
    GpuReading gpu;
    if (!absl::SimpleAtoi(cols[0], &gpu.index) || gpu.index < 0) {
      warn("index is not a number; row skipped");
      continue;
    }
    if (IsUnavailable(cols[1])) {
      warn("no uuid; row skipped");
      continue;
    }
    gpu.uuid = std::string(cols[1]);
    gpu.name = IsUnavailable(cols[2]) ? "" : std::string(cols[2]);
    // value * multiply / divide, in base units (dividing by 100 gives 0.97, not
    // 0.9700000000000001).
    struct Field {
      const char* name;
      double multiply, divide;
      std::optional<double>* out;
    };
    const Field fields[] = {
        {"utilization.gpu", 1, 100, &gpu.utilization_ratio},
        {"memory.used", kMiB, 1, &gpu.memory_used_bytes},
        {"memory.total", kMiB, 1, &gpu.memory_total_bytes},
        {"power.draw", 1, 1, &gpu.power_watts},
        {"temperature.gpu", 1, 1, &gpu.temperature_celsius},
        {"clocks.sm", 1e6, 1, &gpu.sm_clock_hertz},
        {"ecc.errors.uncorrected.volatile.total", 1, 1, &gpu.ecc_uncorrected_errors},
    };
    for (size_t i = 0; i < std::size(fields); ++i) {
      const absl::string_view value = cols[3 + i];
      if (IsUnavailable(value)) continue;
      double v = 0;
      // Temperatures may be negative in principle; nothing else here can.
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) ||
          (v < 0 && fields[i].out != &gpu.temperature_celsius)) {
        warn(absl::StrCat(fields[i].name, " is '", value, "'; field skipped"));
        continue;
      }
      *fields[i].out = v * fields[i].multiply / fields[i].divide;
    }
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

absl::StatusOr<std::vector<GpuReading>> QueryGpuMetrics(const std::string& nvidia_smi,
                                                        absl::Duration timeout,
                                                        std::vector<std::string>* warnings) {
  int status = 0;
  absl::StatusOr<std::string> out = RunWithTimeout(
      {nvidia_smi, absl::StrCat("--query-gpu=", kGpuMetricsQuery), "--format=csv,noheader,nounits"},
      timeout, &status);
  if (!out.ok()) return out.status();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat(nvidia_smi, " failed (",
                     WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                                       : absl::StrCat("signal ", WTERMSIG(status)),
                     "): ", absl::StripAsciiWhitespace(out->substr(0, 500))));
  }
  return ParseGpuMetricsCsv(*out, warnings);
}

std::optional<int> ParseXidLine(absl::string_view line) {
  constexpr absl::string_view kMarker = "NVRM: Xid (";
  const size_t at = line.find(kMarker);
  if (at == absl::string_view::npos) return std::nullopt;
  absl::string_view rest = line.substr(at + kMarker.size());
  const size_t close = rest.find(')');
  if (close == absl::string_view::npos) return std::nullopt;
  rest = rest.substr(close + 1);
  if (!absl::ConsumePrefix(&rest, ":")) return std::nullopt;
  rest = absl::StripLeadingAsciiWhitespace(rest);
  size_t digits = 0;
  while (digits < rest.size() && digits < 6 && absl::ascii_isdigit(rest[digits])) ++digits;
  if (digits == 0 || (digits < rest.size() && rest[digits] != ',' && rest[digits] != ' ')) {
    return std::nullopt;
  }
  int xid = 0;
  if (!absl::SimpleAtoi(rest.substr(0, digits), &xid)) return std::nullopt;
  return xid;
}

KernelLogReader::KernelLogReader(std::string path) : path_(std::move(path)) {}

KernelLogReader::~KernelLogReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::vector<int>> KernelLogReader::ReadNewXids(size_t max_bytes) {
  if (!error_.ok()) return error_;
  auto fail = [&](int err, absl::string_view what) {
    error_ = absl::ErrnoToStatus(err, absl::StrCat("kernel log ", path_, ": ", what));
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return error_;
  };
  if (fd_ < 0) {
    fd_ = open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) return fail(errno, "cannot open");
  }
  std::vector<int> xids;
  // /dev/kmsg hands out one whole record per read and refuses a buffer shorter than it (records
  // are at most ~8 KiB).
  char buf[16384];
  size_t total = 0;
  while (total < max_bytes) {
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE) continue;  // kmsg: records overwritten before we read them; go on
      if (errno == EAGAIN) break;    // kmsg: nothing new
      return fail(errno, "read failed");
    }
    if (n == 0) break;  // a plain file's end, for now
    total += static_cast<size_t>(n);
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = partial_.find('\n', start)) != std::string::npos) {
      if (auto xid = ParseXidLine(absl::string_view(partial_).substr(start, nl - start))) {
        xids.push_back(*xid);
      }
      start = nl + 1;
    }
    partial_.erase(0, start);
    if (partial_.size() > sizeof(buf)) partial_.clear();  // no newline in sight: not a log
  }
  return xids;
}

}  // namespace trainctl::worker
