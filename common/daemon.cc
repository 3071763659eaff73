#include "common/daemon.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace trainctl {

absl::Status InitDaemon(absl::string_view log_level, sigset_t* stop_signals) {
  LogLevel level;
  if (absl::Status s = ParseLogLevel(log_level, &level); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log_level: ", s.message()));
  }
  SetLogLevel(level);
  sigemptyset(stop_signals);
  sigaddset(stop_signals, SIGINT);
  sigaddset(stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, stop_signals, nullptr);
  return absl::OkStatus();
}

}  // namespace trainctl
