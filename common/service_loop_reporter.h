// What a daemon's work loop tells its service manager (service_notifier.h): READY=1 once the daemon
// is ready, STATUS=<line> whenever its one-line state changes, and WATCHDOG=1 every half watchdog
// interval. Tick() is called from the loop that does the daemon's work (the coordinator's cluster
// loop, the worker's session loop), never from a timer thread of its own, so a loop that hangs
// stops the pings and systemd (WatchdogSec=) restarts the daemon.
#ifndef TRAINCTL_COMMON_SERVICE_LOOP_REPORTER_H_
#define TRAINCTL_COMMON_SERVICE_LOOP_REPORTER_H_

#include <atomic>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/service_notifier.h"

namespace trainctl {

struct ServiceLoopOptions {
  // The supervisor's watchdog timeout (TakeSystemdWatchdogInterval()); pings go every half of it.
  // Zero: no pings.
  absl::Duration watchdog_interval = absl::ZeroDuration();
  // TEST ONLY (the daemons' --testonly_stall_file): while this file exists, Tick() blocks, so the
  // loop it is called from hangs as a deadlocked loop would and the pings stop. It first sends
  // STATUS=test-only stall (...) so a test knows the hang began. Empty: never.
  std::string testonly_stall_file;
  // How often a stalled Tick() looks for the file again.
  absl::Duration stall_poll = absl::Milliseconds(20);
};

// Not thread-safe: Tick() is called from one loop thread. Stopping() may be called from any thread
// (it only notifies).
class ServiceLoopReporter {
 public:
  // `notifier` and `clock` are not owned and must outlive the reporter.
  ServiceLoopReporter(ServiceNotifier* notifier, Clock* clock, ServiceLoopOptions options);

  // One pass of the loop. `ready`: the daemon does its job now (READY=1 is sent the first time it
  // is true, and only then); `status`: its state in one short line (sent when it changed; newlines
  // are replaced by spaces). Sends WATCHDOG=1 when half the watchdog interval has passed since the
  // last ping. The loop must call it at least that often.
  void Tick(bool ready, absl::string_view status);

  // STOPPING=1 with a last status line. Later Ticks only ping the watchdog (the daemon is still
  // supervised while it shuts down); their status and readiness are not sent.
  void Stopping(absl::string_view status);

 private:
  void StallWhileFileExists();

  ServiceNotifier* const notifier_;
  Clock* const clock_;
  const ServiceLoopOptions options_;
  std::atomic<bool> stopping_{false};
  bool ready_sent_ = false;
  std::string last_status_;
  absl::Time last_ping_ = absl::InfinitePast();
};

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_SERVICE_LOOP_REPORTER_H_
