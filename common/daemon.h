// Start-up shared by the daemons (trainctl-coordinator, trainctl-worker): flags, the log level and
// signal mask, the ready files tests and scripts wait on, and the thread that takes the stop
// signals. Their metrics endpoint starts with metrics::StartDaemonMetrics (common/metrics_http.h).
#ifndef TRAINCTL_COMMON_DAEMON_H_
#define TRAINCTL_COMMON_DAEMON_H_

#include <signal.h>

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// Sets the log level from a --log_level value (INVALID_ARGUMENT naming the flag otherwise) and
// blocks SIGINT and SIGTERM in this thread, so every thread started afterwards inherits the mask
// and one thread can take them with sigwait(stop_signals). Call first thing in main.
absl::Status InitDaemon(absl::string_view log_level, sigset_t* stop_signals);

// main's flag handling: absl's flags with `usage` as the usage message and `--version` printing
// the build (common/build_info.h) as `program`.
void ParseDaemonFlags(int argc, char** argv, const char* program, const char* usage);

// Writes `text` and a newline to `path` through a temporary file renamed into place, so a reader
// never sees half of it; nothing when `path` is empty. The daemons' --ready_file and
// --metrics_ready_file. UNAVAILABLE naming the path when it cannot be written.
absl::Status WriteReadyFile(const std::string& path, const std::string& text);

// A thread that takes `signals` (blocked in every thread: InitDaemon's stop signals, plus SIGHUP
// where the caller blocked it too): each SIGHUP calls `on_hangup`, and the thread waits on; the
// first other signal calls `on_stop(signal)` and ends it. Joined by the destructor, so `on_stop`
// must make the thread's owner stop (or have run) before it is destroyed.
class StopSignalThread {
 public:
  StopSignalThread(sigset_t signals, std::function<void(int)> on_stop,
                   std::function<void()> on_hangup = nullptr);
  ~StopSignalThread();
  StopSignalThread(const StopSignalThread&) = delete;
  StopSignalThread& operator=(const StopSignalThread&) = delete;

 private:
  std::thread thread_;
};

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_DAEMON_H_
