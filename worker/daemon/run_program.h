// Running a node tool (nvidia-smi) from the daemon: bounded in time and output, so that a tool hung
// on a lost GPU never holds a daemon thread for good.
#ifndef TRAINCTL_WORKER_DAEMON_RUN_PROGRAM_H_
#define TRAINCTL_WORKER_DAEMON_RUN_PROGRAM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl::worker {

// Runs argv (argv[0] a path, or a name looked up in PATH) in a process group of its own, stdout and
// stderr into one string (its first MiB), killing the group after `timeout`. The daemon blocks
// SIGTERM/SIGINT for sigwait: the child gets an empty mask and default dispositions. Returns the
// output with the wait status in `*exit_status`; UNAVAILABLE when it cannot run or times out.
absl::StatusOr<std::string> RunWithTimeout(const std::vector<std::string>& argv,
                                           absl::Duration timeout, int* exit_status);

// RunWithTimeout, then UNAVAILABLE naming the program, how it ended and the start of its output
// when it did not exit 0.
absl::StatusOr<std::string> RunToCompletion(const std::vector<std::string>& argv,
                                            absl::Duration timeout);

}  // namespace trainctl::worker

#endif  // TRAINCTL_WORKER_DAEMON_RUN_PROGRAM_H_
