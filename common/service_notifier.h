// How a daemon talks to its service manager: systemd's notify protocol (sd_notify(3)). The daemons
// send READY=1, STATUS=..., WATCHDOG=1 and STOPPING=1 through a ServiceNotifier, so a test can
// record them without systemd (tests/testing) and the daemons run the same without a supervisor.
#ifndef TRAINCTL_COMMON_SERVICE_NOTIFIER_H_
#define TRAINCTL_COMMON_SERVICE_NOTIFIER_H_

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainctl {

// Thread-safe implementations: the daemons notify from their loop thread and their signal thread.
class ServiceNotifier {
 public:
  virtual ~ServiceNotifier() = default;
  // Sends one state message: newline-separated VARIABLE=VALUE assignments ("READY=1",
  // "STATUS=serving on :50051"). Never fails the caller: a supervisor that cannot be told is
  // logged.
  virtual void Notify(absl::string_view state) = 0;
};

// libsystemd's sd_notify. Sends to $NOTIFY_SOCKET (set by systemd for Type=notify units); without
// it every Notify does nothing. A failed send is logged once.
class SystemdNotifier final : public ServiceNotifier {
 public:
  void Notify(absl::string_view state) override;
};

// The watchdog interval systemd gave this process ($WATCHDOG_USEC, and $WATCHDOG_PID naming this
// process when set; sd_watchdog_enabled(3)), zero when there is none. Removes both variables from
// the environment, so processes the daemon starts (trainer ranks) do not see them. Reads the
// environment: call once, in main, before starting threads.
absl::Duration TakeSystemdWatchdogInterval();

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_SERVICE_NOTIFIER_H_
