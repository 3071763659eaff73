// Figures about processes from /proc, for metrics and benchmarks.
#ifndef TRAINCTL_COMMON_PROCESS_STATS_H_
#define TRAINCTL_COMMON_PROCESS_STATS_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// The peak resident set size (VmHWM) in bytes; 0 where /proc/self/status is not there.
int64_t PeakRssBytes();
// The resident set size now (VmRSS) in bytes; 0 where /proc/self/status is not there.
int64_t CurrentRssBytes();

// One process's CPU time and memory, from /proc/PID/stat (one read, so the figures agree).
struct ProcessSample {
  double cpu_seconds = 0;      // utime + stime (not its reaped children's)
  int64_t resident_bytes = 0;  // rss (pages) * page size, as /proc/PID/statm's second field
  pid_t process_group = 0;
  uint64_t start_ticks = 0;  // starttime: with the pid, names the process (pids are reused)
  char state = '?';          // R, S, D, Z, ...
};

// Parses the text of /proc/PID/stat (`pid (comm) state ppid pgrp ...`; comm may hold spaces and
// parentheses). INVALID_ARGUMENT naming the field when it is malformed or truncated.
absl::StatusOr<ProcessSample> ParseProcStat(absl::string_view stat, long clock_ticks_per_second,
                                            long page_size);

// Reads /proc/PID/stat. NOT_FOUND when the process is gone; INVALID_ARGUMENT as ParseProcStat.
absl::StatusOr<ProcessSample> ReadProcessSample(pid_t pid);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_PROCESS_STATS_H_
