#include "common/service_notifier.h"

#include <systemd/sd-daemon.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/logging.h"

namespace trainctl {

void SystemdNotifier::Notify(absl::string_view state) {
  static std::atomic<bool> warned{false};
  const int r = sd_notify(/*unset_environment=*/0, std::string(state).c_str());
  if (r < 0 && !warned.exchange(true)) {
    TRAINCTL_LOG(WARNING) << "sd_notify to $NOTIFY_SOCKET failed: " << std::strerror(-r)
                          << " (the service manager will not see this daemon's state)";
  }
}

absl::Duration TakeSystemdWatchdogInterval() {
  uint64_t usec = 0;
  const int r = sd_watchdog_enabled(/*unset_environment=*/1, &usec);
  if (r < 0) {
    TRAINCTL_LOG(WARNING) << "$WATCHDOG_USEC: " << std::strerror(-r) << "; no watchdog pings";
    return absl::ZeroDuration();
  }
  if (r == 0 || usec == 0) return absl::ZeroDuration();
  return absl::Microseconds(static_cast<int64_t>(usec));
}

}  // namespace trainctl
