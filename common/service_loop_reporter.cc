#include "common/service_loop_reporter.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"

namespace trainctl {

ServiceLoopReporter::ServiceLoopReporter(ServiceNotifier* notifier, Clock* clock,
                                         ServiceLoopOptions options)
    : notifier_(notifier), clock_(clock), options_(std::move(options)) {}

void ServiceLoopReporter::Tick(bool ready, absl::string_view status) {
  if (!options_.testonly_stall_file.empty()) StallWhileFileExists();
  std::string state;
  if (stopping_.load()) {
    ready = ready_sent_;
    status = last_status_;
  }
  if (ready && !ready_sent_) {
    state = "READY=1\n";
    ready_sent_ = true;
  }
  std::string line = absl::StrReplaceAll(status, {{"\n", " "}});
  if (line != last_status_) {
    absl::StrAppend(&state, "STATUS=", line, "\n");
    last_status_ = std::move(line);
  }
  if (options_.watchdog_interval > absl::ZeroDuration()) {
    const absl::Time now = clock_->Now();
    if (now - last_ping_ >= options_.watchdog_interval / 2) {
      absl::StrAppend(&state, "WATCHDOG=1\n");
      last_ping_ = now;
    }
  }
  if (!state.empty()) {
    state.pop_back();  // the last newline
    notifier_->Notify(state);
  }
}

void ServiceLoopReporter::Stopping(absl::string_view status) {
  stopping_.store(true);
  notifier_->Notify(
      absl::StrCat("STOPPING=1\nSTATUS=", absl::StrReplaceAll(status, {{"\n", " "}})));
}

void ServiceLoopReporter::StallWhileFileExists() {
  const char* path = options_.testonly_stall_file.c_str();
  if (access(path, F_OK) != 0) return;
  TRAINCTL_LOG(WARNING) << "test-only stall: the loop hangs while " << path << " exists";
  notifier_->Notify(absl::StrCat("STATUS=test-only stall (", path, ")"));
  last_status_.clear();  // the real status goes again afterwards
  while (access(path, F_OK) == 0) absl::SleepFor(options_.stall_poll);
  TRAINCTL_LOG(WARNING) << "test-only stall over";
}

}  // namespace trainctl
