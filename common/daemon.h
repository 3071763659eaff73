// Start-up shared by the daemons (trainctl-coordinator, trainctl-worker).
#ifndef TRAINCTL_COMMON_DAEMON_H_
#define TRAINCTL_COMMON_DAEMON_H_

#include <signal.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainctl {

// Sets the log level from a --log_level value (INVALID_ARGUMENT naming the flag otherwise) and
// blocks SIGINT and SIGTERM in this thread, so every thread started afterwards inherits the mask
// and one thread can take them with sigwait(stop_signals). Call first thing in main.
absl::Status InitDaemon(absl::string_view log_level, sigset_t* stop_signals);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_DAEMON_H_
