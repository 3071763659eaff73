// Child processes for integration tests: the real binaries, started with fork/exec, their output
// captured to files, waited for with deadlines, killed with any signal.
#ifndef TRAINCTL_TESTS_TESTING_SUBPROCESS_H_
#define TRAINCTL_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl::testing {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
  absl::Duration elapsed;
};

// Runs `argv` to completion (killing it after `timeout`) with extra `env` entries.
// `cwd`, when not empty, is the child's working directory.
RunResult Run(const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& env = {},
              absl::Duration timeout = absl::Seconds(60), const std::string& cwd = "");

// A long-running child (a daemon). Stdout and stderr go to `log_path`. The destructor kills it
// (SIGKILL) if it is still running and reaps it.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::string& log_path);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  void Kill(int signal);
  // Waits for exit up to `timeout`; the exit code, -1 for a signal, or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

// Polls `condition` every few milliseconds until it holds or `timeout` passes. The way tests wait
// for another process (no fixed sleeps).
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout);

std::string ReadFileOrEmpty(const std::string& path);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released), for a
// child that must be told its port up front (a rendezvous address). 0 if none could be had.
int FreeLoopbackPort();

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_SUBPROCESS_H_
