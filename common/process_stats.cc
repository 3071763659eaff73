#include "common/process_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainctl {

namespace {

int64_t StatusKilobytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t length = std::strlen(field);
  while (std::getline(status, line)) {
    if (line.compare(0, length, field) == 0) return std::atoll(line.c_str() + length) * 1024;
  }
  return 0;
}

}  // namespace

int64_t PeakRssBytes() { return StatusKilobytes("VmHWM:"); }

int64_t CurrentRssBytes() { return StatusKilobytes("VmRSS:"); }

absl::StatusOr<ProcessSample> ParseProcStat(absl::string_view stat, long clock_ticks_per_second,
                                            long page_size) {
  // comm is whatever the program named itself, ')' included: the fields start after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc/PID/stat: no ')' closing the command name");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipWhitespace());
  // fields[0] is field 3 (state) of proc(5); rss, field 24, is the last one needed.
  constexpr size_t kState = 0, kPgrp = 2, kUtime = 11, kStime = 12, kStart = 19, kRss = 21;
  if (fields.size() <= kRss) {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/PID/stat: ", fields.size() + 2, " fields, expected at least 24"));
  }
  auto number = [&](size_t i, const char* name, auto* out) -> absl::Status {
    if (!absl::SimpleAtoi(fields[i], out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/PID/stat: ", name, " (field ", i + 3, ") is '", fields[i], "'"));
    }
    return absl::OkStatus();
  };
  ProcessSample sample;
  if (fields[kState].size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/PID/stat: state is '", fields[kState], "'"));
  }
  sample.state = fields[kState][0];
  int pgrp = 0;
  uint64_t utime = 0, stime = 0;
  int64_t rss = 0;
  for (absl::Status s :
       {number(kPgrp, "pgrp", &pgrp), number(kUtime, "utime", &utime),
        number(kStime, "stime", &stime), number(kStart, "starttime", &sample.start_ticks),
        number(kRss, "rss", &rss)}) {
    if (!s.ok()) return s;
  }
  sample.process_group = pgrp;
  sample.cpu_seconds =
      static_cast<double>(utime + stime) /
      static_cast<double>(clock_ticks_per_second > 0 ? clock_ticks_per_second : 100);
  sample.resident_bytes = rss > 0 ? rss * page_size : 0;  // a zombie's rss is 0
  return sample;
}

absl::StatusOr<ProcessSample> ReadProcessSample(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT || errno == ESRCH
               ? absl::NotFoundError(absl::StrCat("no process ", pid))
               : absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  char buf[2048];  // the whole line is well under 1 KiB
  ssize_t n;
  do {
    n = read(fd, buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  const int read_errno = errno;
  close(fd);
  // A process that exits between open and read reads as ESRCH (or nothing).
  if (n <= 0) {
    return n == 0 || read_errno == ESRCH
               ? absl::NotFoundError(absl::StrCat("no process ", pid))
               : absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(read_errno)));
  }
  static const long ticks = sysconf(_SC_CLK_TCK);
  static const long page = sysconf(_SC_PAGESIZE);
  return ParseProcStat(absl::string_view(buf, static_cast<size_t>(n)), ticks, page);
}

}  // namespace trainctl
